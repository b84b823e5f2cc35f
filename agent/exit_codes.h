// Exit codes of muster (docs/ARCHITECTURE.md, "Where each rule lives"); 128+N when
// ended by signal N.
#ifndef MUSTER_AGENT_EXIT_CODES_H_
#define MUSTER_AGENT_EXIT_CODES_H_

namespace muster {

inline constexpr int kExitSuccess = 0;
inline constexpr int kExitWorkersFailed = 1;
inline constexpr int kExitUsage = 2;
// This node's host was excluded from the job (a bad node: its workers were
// the root cause of --max-node-failures failures in a row, or its GPUs
// failed a check); the job goes on without it. Sysexits' EX_UNAVAILABLE.
inline constexpr int kExitNodeExcluded = 69;
// The job stopped for --max-no-progress-restarts: it fails the same way
// every time, and a requeue would do the same again. Do not requeue.
// Sysexits' EX_SOFTWARE.
inline constexpr int kExitNoProgress = 70;
// The job failed after some round reached a new step (MUSTER_PROGRESS_FILE):
// a requeue resumes it from its checkpoint. Sysexits' EX_TEMPFAIL.
inline constexpr int kExitFailedAfterProgress = 75;

}  // namespace muster

#endif  // MUSTER_AGENT_EXIT_CODES_H_
