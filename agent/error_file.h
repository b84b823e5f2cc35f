// Reads the error file a PyTorch worker writes under @record (TORCHELASTIC_ERROR_FILE).
#ifndef MUSTER_AGENT_ERROR_FILE_H_
#define MUSTER_AGENT_ERROR_FILE_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace muster {

// What a worker said about its own failure. Every field may be empty: the file is tolerated with
// any of them missing.
struct WorkerError {
  std::string message;    // "RuntimeError: boom" (PyTorch's "<Type>: <text>"), as written.
  std::string traceback;  // The Python traceback (py_callstack), as written; empty if none.
  std::optional<absl::Time> timestamp;  // When the worker recorded the error; whole seconds from
                                        // PyTorch. Absent, non-positive or unparsable: nullopt.
};

// Parses an error file's contents. Accepted shapes (unknown keys, e.g. "errorTraits", and the
// "errorCode" a torchrun agent adds when it copies a child's file, are ignored):
//   PyTorch >= 1.9:  {"message": {"message": "...", "extraInfo": {"py_callstack": "...",
//                                                                 "timestamp": "1700000000"}}}
//   older:           {"message": "...", "timestamp": 1700000000}
// A timestamp may be a JSON string or number of epoch seconds, fractional or not.
// InvalidArgument if json is not a JSON object.
absl::StatusOr<WorkerError> ParseErrorJson(std::string_view json);

// Reads and parses the error file at path. NotFound if there is none (the worker wrote none);
// InvalidArgument if it is not a JSON object, e.g. empty or cut short, or over 16 MiB.
absl::StatusOr<WorkerError> ReadErrorFile(const std::string& path);

}  // namespace muster

#endif  // MUSTER_AGENT_ERROR_FILE_H_
