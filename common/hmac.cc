#include "common/hmac.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstdlib>

namespace muster {

std::string HmacSha256(absl::string_view key, absl::string_view message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  // One shot: fails only when OpenSSL cannot allocate, which ends the process.
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac,
           &length) == nullptr) {
    abort();
  }
  return std::string(reinterpret_cast<const char*>(mac), length);
}

}  // namespace muster
