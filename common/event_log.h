// Opening an event log (the agent's --rdzv-conf event_log=, musterd
// --event-log): a file events are appended to, one line per write.
#ifndef MUSTER_COMMON_EVENT_LOG_H_
#define MUSTER_COMMON_EVENT_LOG_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/unique_handle.h"

namespace muster {

struct OpenedEventLog {
  UniqueFd fd;
  // Set when others can read the file (its mode allows it): worth a warning.
  std::optional<std::string> warning;
};

// Opens `path` to append to, creating it mode 600 (the events name jobs,
// hosts and failures). Not through a symbolic link, and not a FIFO (whose
// open would block). `flag` names the option in messages ("--event-log").
// Errors (kInvalidArgument, naming the fix): it cannot be opened, or it is
// not a regular file this user owns.
absl::StatusOr<OpenedEventLog> OpenEventLog(const std::string& path, absl::string_view flag);

}  // namespace muster

#endif  // MUSTER_COMMON_EVENT_LOG_H_
