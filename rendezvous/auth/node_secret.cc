#include "rendezvous/auth/node_secret.h"

#include <sys/random.h>

#include <cerrno>

#include "common/status.h"

namespace muster::rdzv {

absl::StatusOr<std::string> NewNodeSecret() {
  unsigned char bytes[16];
  size_t got = 0;
  // Bounded: getrandom returns up to 256 bytes at once, and EINTR only before any.
  for (int attempt = 0; got < sizeof bytes && attempt < 100; ++attempt) {
    const ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "getrandom for a node secret");
    }
    got += static_cast<size_t>(n);
  }
  if (got < sizeof bytes) return absl::InternalError("getrandom gave no node secret");
  static const char kHex[] = "0123456789abcdef";
  std::string secret;
  secret.reserve(2 * sizeof bytes);
  for (unsigned char b : bytes) {
    secret.push_back(kHex[b >> 4]);
    secret.push_back(kHex[b & 0xf]);
  }
  return secret;
}

}  // namespace muster::rdzv
