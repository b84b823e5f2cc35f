// Comparing secrets: tokens, passwords, node secrets.
#ifndef MUSTER_COMMON_CONSTANT_TIME_H_
#define MUSTER_COMMON_CONSTANT_TIME_H_

#include "absl/strings/string_view.h"

namespace muster {

// Whether a == b, in time that depends on the lengths only, not on where
// the first difference is.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace muster

#endif  // MUSTER_COMMON_CONSTANT_TIME_H_
