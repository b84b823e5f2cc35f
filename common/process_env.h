// What a process asks of its environment, shared by muster and
// muster-allreduce.
#ifndef MUSTER_COMMON_PROCESS_ENV_H_
#define MUSTER_COMMON_PROCESS_ENV_H_

#include <optional>
#include <string>
#include <vector>

namespace muster {

// The environment variable `name`, or nullopt when it is unset.
std::optional<std::string> GetEnv(const std::string& name);

// This process's environment, as KEY=VALUE entries.
std::vector<std::string> EnvironmentEntries();

// This machine's host name ("localhost" if it cannot be read).
std::string HostName();

}  // namespace muster

#endif  // MUSTER_COMMON_PROCESS_ENV_H_
