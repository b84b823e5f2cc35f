// Small status helpers shared by every part of muster.
#ifndef MUSTER_COMMON_STATUS_H_
#define MUSTER_COMMON_STATUS_H_

#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace muster {

// Turns an errno value into a status whose message names what failed:
// "open /tmp/x: No such file or directory". The one place errno becomes a status.
absl::Status ErrnoToStatus(int error_number, absl::string_view what);

}  // namespace muster

#define MUSTER_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status muster_status_ = (expr);          \
    if (!muster_status_.ok()) return muster_status_; \
  } while (0)

#endif  // MUSTER_COMMON_STATUS_H_
