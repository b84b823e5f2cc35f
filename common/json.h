// Writing JSON text for what muster prints for programs to read (the agent's
// events). Pure.
#ifndef MUSTER_COMMON_JSON_H_
#define MUSTER_COMMON_JSON_H_

#include <string>

#include "absl/strings/string_view.h"

namespace muster {

// `text` as a JSON string, quotes included: '"', '\\' and control characters
// escaped, valid UTF-8 kept as it is, and each byte of invalid UTF-8 (a
// worker's message may hold any bytes) written as U+FFFD, so the result is
// always valid JSON on one line.
std::string JsonQuote(absl::string_view text);

}  // namespace muster

#endif  // MUSTER_COMMON_JSON_H_
