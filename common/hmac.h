// HMAC-SHA256 (RFC 2104 over FIPS 180-4, OpenSSL's): what signs the
// questions the nodes of a round ask each other, and derives their key.
#ifndef MUSTER_COMMON_HMAC_H_
#define MUSTER_COMMON_HMAC_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace muster {

inline constexpr size_t kHmacSha256Length = 32;

// The 32-byte MAC of `message` under `key` (raw bytes, not hex).
std::string HmacSha256(absl::string_view key, absl::string_view message);

}  // namespace muster

#endif  // MUSTER_COMMON_HMAC_H_
