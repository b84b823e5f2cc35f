// Resolving --nproc-per-node gpu|cpu|auto|N to a number of workers.
#ifndef MUSTER_LAUNCHER_NPROC_H_
#define MUSTER_LAUNCHER_NPROC_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "agent/config.h"

namespace muster {

// Pure: `gpus` is the number of visible GPUs, `cpus` of usable CPUs.
// kInvalidArgument for `gpu` when there is no GPU.
absl::StatusOr<int> ResolveNproc(NprocKind kind, int count, int gpus, int cpus);

// GPUs this process may use: the entries of CUDA_VISIBLE_DEVICES when it is
// set (`cuda_visible_devices`), else the GPUs the NVIDIA driver lists under
// `driver_dir` (/proc/driver/nvidia/gpus), else, where that is missing (some
// sandboxes and containers), the device nodes /dev/nvidia0, 1, ... in `dev_dir`.
int CountVisibleGpus(const std::optional<std::string>& cuda_visible_devices,
                     const std::string& driver_dir = "/proc/driver/nvidia/gpus",
                     const std::string& dev_dir = "/dev");

}  // namespace muster

#endif  // MUSTER_LAUNCHER_NPROC_H_
