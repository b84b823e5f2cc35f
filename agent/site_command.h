// A site's own command, run by the agent at a moment it names (for example
// --on-node-excluded, which may drain the node in Slurm): `sh -c CMD` with
// the agent's environment and a few variables of its own, its output on the
// agent's, bounded in time.
#ifndef MUSTER_AGENT_SITE_COMMAND_H_
#define MUSTER_AGENT_SITE_COMMAND_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace muster {

// Runs `command` with /bin/sh -c, the agent's environment plus `extra_env`
// (KEY=VALUE), in a process group of its own with no signal blocked, and
// waits at most `limit`; past it the group is killed. Returns how it ended
// ("exit code 0", "signal 9", "killed after 60 s"), or why it could not start.
absl::StatusOr<std::string> RunSiteCommand(const std::string& command,
                                           const std::vector<std::string>& extra_env,
                                           absl::Duration limit);

}  // namespace muster

#endif  // MUSTER_AGENT_SITE_COMMAND_H_
