#include "launcher/nproc.h"

#include <filesystem>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace muster {

absl::StatusOr<int> ResolveNproc(NprocKind kind, int count, int gpus, int cpus) {
  switch (kind) {
    case NprocKind::kCount: return count;
    case NprocKind::kGpu:
      if (gpus <= 0) {
        return absl::InvalidArgumentError(
            "--nproc-per-node gpu: no GPU is visible on this machine (no NVIDIA driver, or "
            "CUDA_VISIBLE_DEVICES is empty); give a number, or use cpu or auto");
      }
      return gpus;
    case NprocKind::kCpu: return cpus > 0 ? cpus : 1;
    case NprocKind::kAuto: return gpus > 0 ? gpus : (cpus > 0 ? cpus : 1);
  }
  return count;
}

int CountVisibleGpus(const std::optional<std::string>& cuda_visible_devices,
                     const std::string& driver_dir, const std::string& dev_dir) {
  if (cuda_visible_devices) {
    int n = 0;
    for (absl::string_view entry : absl::StrSplit(*cuda_visible_devices, ',')) {
      entry = absl::StripAsciiWhitespace(entry);
      // CUDA stops at the first invalid entry; "-1" is the usual way to hide every GPU.
      if (entry.empty() || entry.front() == '-') break;
      ++n;
    }
    return n;
  }
  std::error_code error;
  int n = 0;
  for (std::filesystem::directory_iterator it(driver_dir, error), end; !error && it != end;
       it.increment(error)) {
    ++n;
  }
  if (n > 0 || std::filesystem::exists(driver_dir, error)) return n;
  // nvidia0, nvidia1, ...: not nvidiactl, nvidia-uvm or nvidia-caps.
  for (std::filesystem::directory_iterator it(dev_dir, error), end; !error && it != end;
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (name.size() > 6 && name.starts_with("nvidia") &&
        name.find_first_not_of("0123456789", 6) == std::string::npos) {
      ++n;
    }
  }
  return n;
}

}  // namespace muster
