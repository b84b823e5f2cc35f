// The failure table printed at the end of a failed run: which worker failed first, and how.
#ifndef MUSTER_AGENT_FAILURE_REPORT_H_
#define MUSTER_AGENT_FAILURE_REPORT_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "agent/error_file.h"

namespace muster {

// One worker that did not exit 0.
struct WorkerFailure {
  int rank = -1;
  int local_rank = -1;
  std::string host;
  int pid = 0;
  int exit_code = 0;                 // Meaningful when signal == 0 (the worker exited).
  int signal = 0;                    // Non-zero when the worker was killed by this signal.
  absl::Time time;                   // When the agent saw the worker die.
  std::string error_file;            // TORCHELASTIC_ERROR_FILE given to the worker; may be empty.
  std::optional<WorkerError> error;  // What that file said, if the worker wrote it.
  // The agent could not start the worker for a lack of its own (descriptors,
  // memory, processes): no fault of the worker's, so no restart is spent on it.
  bool agent_out_of_resources = false;
  // A worker of the pre-flight all-reduce (--preflight): the job closes
  // without a restart.
  bool preflight = false;
  // Set when muster itself killed the worker for hanging: why ("its file
  // timer 'step' expired ..."), and the stacks of its threads taken just
  // before (bounded; `stack_file` has them in full, or says why there are none).
  std::string killed_for;
  std::string stack;
  std::string stack_file;
  // The NCCL flight recorder's dump PyTorch wrote for this rank while it ran
  // (TORCH_NCCL_DUMP_ON_TIMEOUT, TORCH_NCCL_DEBUG_INFO_TEMP_FILE); "" if none.
  std::string nccl_dump;
};

// "SIGSEGV"; "SIGRTMIN+3" for real-time signals; "signal 99" for a number that names no signal.
std::string SignalName(int sig);

// "exit code 1", or "Signal 11 (SIGSEGV)" as torchrun words it.
std::string DescribeExit(const WorkerFailure& failure);

// The index of the root cause: the failure that happened first. A failure happened at its error
// file's timestamp if it has one (the worker's own account), else when the agent saw it die.
// Times are compared in whole seconds, the precision PyTorch writes; within the same second the
// one the agent saw die first wins, then the earlier index. failures.size() if failures is empty.
size_t RootCauseIndex(const std::vector<WorkerFailure>& failures);

// The report of a failed run, in torchrun's frame ("<script> FAILED", "Failures:",
// "Root Cause (first observed failure):", rules of '=' and '-') with the failures as a table, one
// row each, root cause first and marked '*', the others in the order they failed:
//   rank (local_rank), host, pid, exit, time the agent saw it die (UTC, ISO 8601, ms), and the
//   first line of the error file's message, or a hint to use @record when there is none.
// Below the table: the root cause's error file path, full message and traceback; when muster
// killed it for hanging, why, and the stacks it took.
// attempts: how many times the worker group was started (restarts + 1). Ends with '\n'.
std::string FormatFailureReport(std::string_view script, int attempts,
                                const std::vector<WorkerFailure>& failures);

}  // namespace muster

#endif  // MUSTER_AGENT_FAILURE_REPORT_H_
