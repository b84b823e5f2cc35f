// Reads accelerate's config file for --accelerate-config
// (launcher/accelerate_config.h): YAML through libyaml, the parser PyYAML is
// built on, with PyYAML's SafeLoader types; a file whose name ends in .json
// as JSON, as accelerate reads it. The edge of accelerate_config.h: files,
// the environment, sockets.
#ifndef MUSTER_LAUNCHER_ACCELERATE_FILE_H_
#define MUSTER_LAUNCHER_ACCELERATE_FILE_H_

#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "launcher/accelerate_config.h"

namespace muster {

// Errors: kNotFound or kPermissionDenied for a file that cannot be read,
// kInvalidArgument for one that is not YAML (or JSON), with the line.
absl::StatusOr<ConfigValue> ReadAccelerateConfig(const std::string& path);

// Parses `text` as the file `path` would be (JSON when path ends in .json).
absl::StatusOr<ConfigValue> ParseAccelerateConfig(const std::string& text, const std::string& path);

// --accelerate-config GIVEN ("default": accelerate's default path) read and
// translated against this process: its environment, its directory, this
// host's ports and cores. The caller sets the result's env in its own
// environment, as accelerate does, and gives its options to ReadCommandLine.
// `slurm_nodes`: the allocation's node count, 0 outside Slurm; `flags`:
// ParsedCommandLine::flags_given.
absl::StatusOr<AccelerateLaunch> LoadAccelerateConfig(const std::string& given, int slurm_nodes,
                                                      const std::set<std::string>& flags);

}  // namespace muster

#endif  // MUSTER_LAUNCHER_ACCELERATE_FILE_H_
