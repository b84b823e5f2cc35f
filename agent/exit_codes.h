// Exit codes of muster (docs/ARCHITECTURE.md, "Where each rule lives"); 128+N when
// ended by signal N.
#ifndef MUSTER_AGENT_EXIT_CODES_H_
#define MUSTER_AGENT_EXIT_CODES_H_

namespace muster {

inline constexpr int kExitSuccess = 0;
inline constexpr int kExitWorkersFailed = 1;
inline constexpr int kExitUsage = 2;

}  // namespace muster

#endif  // MUSTER_AGENT_EXIT_CODES_H_
