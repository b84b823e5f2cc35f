// The process's open-file limit. A process that holds a connection per peer
// (musterd, and the agent that hosts a job's rendezvous) needs more
// descriptors than the usual soft limit of 1024, while the workers it starts
// should get the limit the user gave, not the raised one.
#ifndef MUSTER_COMMON_OPEN_FILES_H_
#define MUSTER_COMMON_OPEN_FILES_H_

#include <sys/resource.h>

#include <optional>
#include <string>

namespace muster {

// Raises the soft RLIMIT_NOFILE to the hard limit. Returns a warning for the
// log when the limit is still below `wanted` (nullopt when it is enough);
// `who` names what the descriptors are for ("agents can connect").
// Not thread-safe: call from main before other threads start.
std::optional<std::string> RaiseOpenFileLimit(rlim_t wanted, const char* who);

// The soft and hard RLIMIT_NOFILE as they were before RaiseOpenFileLimit
// raised them, for the children to get back; nullopt when it did not.
std::optional<rlimit> OriginalOpenFileLimit();

}  // namespace muster

#endif  // MUSTER_COMMON_OPEN_FILES_H_
