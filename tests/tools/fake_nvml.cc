// A stand-in for the driver's libnvidia-ml.so.1, for the integration tests
// and bench/gpu_check_cost.py: the NVML calls the agent makes (agent/nvml_api.h),
// answered from files under $FAKE_NVML_DIR, which a test (or its workers)
// writes while the job runs:
//   count        how many GPUs (default 0)
//   util.<i>     GPU i's utilization in percent (default 0)
//   mem.<i>      GPU i's memory in use, bytes (default 1 GiB; 80 GiB in all)
//   pids/<pid>   a process that uses a GPU: the file holds its index
//   xid.<i>      a critical Xid on GPU i (its number), raised once: the
//                event set's wait renames the file xid.<i>.seen
//   ecc.<i>      GPU i's uncorrected ECC errors since the driver loaded
//   pending.<i>  GPU i has retired pages pending (any content)
//   remap.<i>    "PENDING FAILED": GPU i's row remapping state (0 or 1 each)
//   lost.<i>     GPU i has fallen off the bus: its queries answer GPU_IS_LOST
// A pid whose process is gone is not listed, as NVML lists live contexts.
#include <dirent.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "agent/nvml_api.h"

namespace {

std::string Dir() {
  const char* dir = std::getenv("FAKE_NVML_DIR");
  return dir != nullptr ? dir : "/nonexistent";
}

// The first integer in `path`, or `fallback`.
long long ReadNumber(const std::string& path, long long fallback) {
  FILE* file = std::fopen(path.c_str(), "r");
  if (file == nullptr) return fallback;
  long long value = fallback;
  if (std::fscanf(file, "%lld", &value) != 1) value = fallback;
  std::fclose(file);
  return value;
}

unsigned Index(nvmlDevice_t device) {
  return static_cast<unsigned>(reinterpret_cast<uintptr_t>(device) - 1);
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

bool Lost(nvmlDevice_t device) { return Exists(Dir() + "/lost." + std::to_string(Index(device))); }

unsigned long long NowMicros() {
  timeval now;
  gettimeofday(&now, nullptr);
  return static_cast<unsigned long long>(now.tv_sec) * 1'000'000 + now.tv_usec;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) nvmlReturn_t nvmlInit_v2() { return NVML_SUCCESS; }
__attribute__((visibility("default"))) nvmlReturn_t nvmlShutdown() { return NVML_SUCCESS; }
__attribute__((visibility("default"))) const char* nvmlErrorString(nvmlReturn_t) {
  return "fake NVML error";
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  *count = static_cast<unsigned>(ReadNumber(Dir() + "/count", 0));
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(
    unsigned int index, nvmlDevice_t* device) {
  *device = reinterpret_cast<nvmlDevice_t>(static_cast<uintptr_t>(index) + 1);
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device,
                                                                      char* uuid,
                                                                      unsigned int length) {
  std::snprintf(uuid, length, "GPU-fa4e0000-0000-0000-0000-%012u", Index(device));
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device,
                                                                            nvmlMemory_t* memory) {
  if (Lost(device)) return NVML_ERROR_GPU_IS_LOST;
  memory->total = 80ull << 30;
  memory->used = static_cast<unsigned long long>(
      ReadNumber(Dir() + "/mem." + std::to_string(Index(device)), 1ll << 30));
  memory->free = memory->total - memory->used;
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetUtilizationRates(
    nvmlDevice_t device, nvmlUtilization_t* utilization) {
  utilization->gpu =
      static_cast<unsigned>(ReadNumber(Dir() + "/util." + std::to_string(Index(device)), 0));
  utilization->memory = 0;
  return NVML_SUCCESS;
}

// One sample, now, of the utilization the file gives; none (NOT_FOUND)
// for an idle GPU, as some boards answer (the agent reads the rate then).
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetSamples(
    nvmlDevice_t device, int type, unsigned long long last_seen, int* value_type,
    unsigned int* count, nvmlSample_t* samples) {
  if (type != NVML_GPU_UTILIZATION_SAMPLES) return NVML_ERROR_NOT_SUPPORTED;
  const unsigned long long now = NowMicros();
  if (now <= last_seen) return NVML_ERROR_NOT_FOUND;
  if (ReadNumber(Dir() + "/util." + std::to_string(Index(device)), 0) == 0) {
    return NVML_ERROR_NOT_FOUND;
  }
  *value_type = NVML_VALUE_TYPE_UNSIGNED_INT;
  if (samples == nullptr) {
    *count = 1;
    return NVML_SUCCESS;
  }
  if (*count < 1) return NVML_ERROR_INSUFFICIENT_SIZE;
  *count = 1;
  samples[0].timeStamp = now;
  samples[0].sampleValue.uiVal =
      static_cast<unsigned>(ReadNumber(Dir() + "/util." + std::to_string(Index(device)), 0));
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(
    nvmlDevice_t device, unsigned int* count, nvmlProcessInfo_t* infos) {
  const std::string dir = Dir() + "/pids";
  DIR* listing = opendir(dir.c_str());
  unsigned found = 0;
  const unsigned room = *count;
  if (listing != nullptr) {
    while (dirent* entry = readdir(listing)) {
      const int pid = std::atoi(entry->d_name);
      if (pid <= 0 || kill(pid, 0) != 0) continue;
      if (ReadNumber(dir + "/" + entry->d_name, -1) != static_cast<long long>(Index(device))) {
        continue;
      }
      if (found < room) infos[found] = {static_cast<unsigned>(pid), 256ull << 20, 0, 0};
      ++found;
    }
    closedir(listing);
  }
  *count = found;
  return found > room ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(
    nvmlDevice_t, unsigned int* count, nvmlProcessInfo_t*) {
  *count = 0;
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetTotalEccErrors(
    nvmlDevice_t device, int error_type, int counter_type, unsigned long long* count) {
  if (Lost(device)) return NVML_ERROR_GPU_IS_LOST;
  if (error_type != NVML_MEMORY_ERROR_TYPE_UNCORRECTED || counter_type != NVML_VOLATILE_ECC) {
    return NVML_ERROR_NOT_SUPPORTED;
  }
  *count = static_cast<unsigned long long>(
      ReadNumber(Dir() + "/ecc." + std::to_string(Index(device)), 0));
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(
    nvmlDevice_t device, int* pending) {
  if (Lost(device)) return NVML_ERROR_GPU_IS_LOST;
  *pending = Exists(Dir() + "/pending." + std::to_string(Index(device))) ? 1 : 0;
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetRemappedRows(
    nvmlDevice_t device, unsigned int* corrected, unsigned int* uncorrected, unsigned int* pending,
    unsigned int* failed) {
  if (Lost(device)) return NVML_ERROR_GPU_IS_LOST;
  *corrected = *uncorrected = *pending = *failed = 0;
  FILE* file = std::fopen((Dir() + "/remap." + std::to_string(Index(device))).c_str(), "r");
  if (file == nullptr) return NVML_SUCCESS;
  if (std::fscanf(file, "%u %u", pending, failed) != 2) *pending = *failed = 0;
  std::fclose(file);
  return NVML_SUCCESS;
}

// One event set: what it holds is the xid.<i> files.
__attribute__((visibility("default"))) nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t* set) {
  *set = reinterpret_cast<nvmlEventSet_t>(uintptr_t{1});
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceRegisterEvents(
    nvmlDevice_t, unsigned long long types, nvmlEventSet_t) {
  return (types & NVML_EVENT_TYPE_XID_CRITICAL_ERROR) != 0 ? NVML_SUCCESS
                                                           : NVML_ERROR_NOT_SUPPORTED;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t,
                                                                        nvmlEventData_t* data,
                                                                        unsigned int) {
  const long long count = ReadNumber(Dir() + "/count", 0);
  for (long long i = 0; i < count; ++i) {
    const std::string path = Dir() + "/xid." + std::to_string(i);
    const long long xid = ReadNumber(path, -1);
    if (xid < 0 || std::rename(path.c_str(), (path + ".seen").c_str()) != 0) continue;
    data->device = reinterpret_cast<nvmlDevice_t>(static_cast<uintptr_t>(i) + 1);
    data->eventType = NVML_EVENT_TYPE_XID_CRITICAL_ERROR;
    data->eventData = static_cast<unsigned long long>(xid);
    data->gpuInstanceId = data->computeInstanceId = 0;
    return NVML_SUCCESS;
  }
  return NVML_ERROR_TIMEOUT;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t) {
  return NVML_SUCCESS;
}

}  // extern "C"
