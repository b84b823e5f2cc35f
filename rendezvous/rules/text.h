// Bounding what clients send before the server keeps or logs it.
#ifndef MUSTER_RENDEZVOUS_RULES_TEXT_H_
#define MUSTER_RENDEZVOUS_RULES_TEXT_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace muster::rdzv {

// `text` if it fits in `max_bytes`, else its start and "... [cut: N bytes]",
// `max_bytes` at most in all. Never splits a UTF-8 character.
std::string CutText(absl::string_view text, size_t max_bytes);

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_RULES_TEXT_H_
