// NVML, the GPU driver's management library, loaded at run time: the
// driver ships libnvidia-ml.so.1, and a node without it (or without a GPU)
// runs the same muster, with no GPU check. The few calls used are declared
// in agent/nvml_api.h, from NVML's documented API (Debian's main archive
// has no nvml.h).
#ifndef MUSTER_AGENT_NVML_H_
#define MUSTER_AGENT_NVML_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "agent/gpu_check.h"

namespace muster {

// The library the agent loads: MUSTER_NVML_LIBRARY in the agent's
// environment when set (the tests' fake), else the driver's.
inline constexpr char kNvmlLibraryEnv[] = "MUSTER_NVML_LIBRARY";
inline constexpr char kNvmlLibrary[] = "libnvidia-ml.so.1";

// Loads `library` and initializes NVML. Errors (kNotFound: no library;
// kUnavailable: NVML would not start, e.g. no driver or no GPU) say why,
// for one debug line.
absl::StatusOr<std::unique_ptr<GpuSource>> OpenNvml(const std::string& library);

// The parent of `pid` from /proc/<pid>/stat; 0 when it is gone.
pid_t ParentPid(pid_t pid);

}  // namespace muster

#endif  // MUSTER_AGENT_NVML_H_
