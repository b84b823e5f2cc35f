#include "agent/nvml.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "agent/nvml_api.h"
#include "agent/stack_capture.h"

namespace muster {
namespace {

// Process lists are read into this many entries first, and grown when NVML
// says they do not fit, a few times at most.
constexpr unsigned kProcessesFirst = 64;
constexpr int kMaxGrow = 4;

template <typename Fn>
Fn Symbol(void* library, const char* name) {
  void* symbol = dlsym(library, name);
  Fn fn = nullptr;
  static_assert(sizeof fn == sizeof symbol);
  std::memcpy(&fn, &symbol, sizeof fn);
  return fn;
}

class Nvml final : public GpuSource {
 public:
  static absl::StatusOr<std::unique_ptr<GpuSource>> Open(const std::string& path) {
    void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* error = dlerror();
      return absl::NotFoundError(absl::StrCat("cannot load ", path, ": ", error ? error : "?"));
    }
    std::unique_ptr<Nvml> nvml(new Nvml(library));
    if (absl::Status bound = nvml->Bind(); !bound.ok()) return bound;
    if (nvmlReturn_t rc = nvml->init_(); rc != NVML_SUCCESS) {
      return absl::UnavailableError(absl::StrCat("nvmlInit: ", nvml->Error(rc)));
    }
    nvml->initialized_ = true;
    unsigned count = 0;
    if (nvmlReturn_t rc = nvml->count_(&count); rc != NVML_SUCCESS) {
      return absl::UnavailableError(absl::StrCat("nvmlDeviceGetCount: ", nvml->Error(rc)));
    }
    nvml->BindHealth();
    for (unsigned i = 0; i < count; ++i) {
      nvmlDevice_t device = nullptr;
      if (nvmlReturn_t rc = nvml->handle_(i, &device); rc != NVML_SUCCESS) {
        return absl::UnavailableError(
            absl::StrCat("nvmlDeviceGetHandleByIndex(", i, "): ", nvml->Error(rc)));
      }
      char uuid[NVML_DEVICE_UUID_BUFFER] = {};
      if (nvml->uuid_(device, uuid, sizeof uuid) != NVML_SUCCESS) uuid[0] = '\0';
      nvml->devices_.push_back(device);
      nvml->uuids_.emplace_back(uuid);
    }
    nvml->ListenForXids();
    return std::unique_ptr<GpuSource>(std::move(nvml));
  }

  ~Nvml() override {
    if (events_ != nullptr && event_free_ != nullptr) event_free_(events_);
    if (initialized_ && shutdown_ != nullptr) shutdown_();
    dlclose(library_);
  }

  absl::StatusOr<Health> ReadHealth(int index) override {
    nvmlDevice_t device = devices_.at(index);
    Health health;
    auto lost = [&health](nvmlReturn_t rc) {
      health.lost = health.lost || rc == NVML_ERROR_GPU_IS_LOST;
      return rc == NVML_SUCCESS;
    };
    unsigned long long ecc = 0;
    if (ecc_ != nullptr &&
        lost(ecc_(device, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, &ecc))) {
      health.ecc_uncorrected = ecc;
    }
    int pending = 0;
    if (pages_pending_ != nullptr && lost(pages_pending_(device, &pending))) {
      health.retired_pages_pending = pending != 0;
    }
    unsigned corrected = 0, uncorrected = 0, remap_pending = 0, failed = 0;
    if (remapped_ != nullptr &&
        lost(remapped_(device, &corrected, &uncorrected, &remap_pending, &failed))) {
      health.row_remap_pending = remap_pending != 0;
      health.row_remap_failed = failed != 0;
    }
    // A device every query of which fails: it is gone.
    nvmlMemory_t memory = {};
    lost(memory_(device, &memory));
    return health;
  }

  std::vector<Xid> TakeXids() override {
    std::vector<Xid> out;
    if (events_ == nullptr) return out;
    // Each waits no time: what is queued, until NVML says none is (a timeout).
    for (int i = 0; i < 64; ++i) {
      nvmlEventData_t data = {};
      if (event_wait_(events_, &data, 0) != NVML_SUCCESS) break;
      if (data.eventType != NVML_EVENT_TYPE_XID_CRITICAL_ERROR) continue;
      auto it = std::find(devices_.begin(), devices_.end(), data.device);
      if (it != devices_.end()) {
        out.push_back({static_cast<int>(it - devices_.begin()), data.eventData});
      }
    }
    return out;
  }

  const std::vector<std::string>& uuids() const override { return uuids_; }

  absl::StatusOr<Utilization> ReadUtilization(int index, uint64_t since) override {
    nvmlDevice_t device = devices_.at(index);
    Utilization out;
    // The driver's samples since the last read. None (NOT_FOUND) is what
    // an idle GPU gives on some boards, and what every read gives where the
    // samples are stamped with another clock: then the current rate stands
    // for the span, as one sample.
    if (samples_ != nullptr && samples_supported_) {
      int type = 0;
      unsigned count = 0;
      nvmlReturn_t rc =
          samples_(device, NVML_GPU_UTILIZATION_SAMPLES, since, &type, &count, nullptr);
      if (rc == NVML_SUCCESS && count > 0) {
        std::vector<nvmlSample_t> samples(count);
        rc = samples_(device, NVML_GPU_UTILIZATION_SAMPLES, since, &type, &count, samples.data());
        if (rc == NVML_SUCCESS) {
          for (unsigned i = 0; i < count && i < samples.size(); ++i) {
            if (samples[i].timeStamp <= since) continue;
            const int percent = Percent(type, samples[i].sampleValue);
            ++out.samples;
            out.max_percent = std::max(out.max_percent, percent);
            out.sum_percent += percent;
            out.last = std::max<uint64_t>(out.last, samples[i].timeStamp);
          }
          if (out.samples > 0) return out;
        }
      }
      if (rc == NVML_ERROR_NOT_SUPPORTED) {
        samples_supported_ = false;  // some boards keep no samples: read the rate
      } else if (rc != NVML_SUCCESS && rc != NVML_ERROR_NOT_FOUND) {
        return absl::UnavailableError(absl::StrCat("nvmlDeviceGetSamples: ", Error(rc)));
      }
    }
    nvmlUtilization_t rate = {};
    if (nvmlReturn_t rc = rates_(device, &rate); rc != NVML_SUCCESS) {
      return absl::UnavailableError(absl::StrCat("nvmlDeviceGetUtilizationRates: ", Error(rc)));
    }
    out.samples = 1;
    out.max_percent = static_cast<int>(rate.gpu);
    out.sum_percent = rate.gpu;
    out.last = since;
    return out;
  }

  absl::StatusOr<Memory> ReadMemory(int index) override {
    nvmlMemory_t memory = {};
    if (nvmlReturn_t rc = memory_(devices_.at(index), &memory); rc != NVML_SUCCESS) {
      return absl::UnavailableError(absl::StrCat("nvmlDeviceGetMemoryInfo: ", Error(rc)));
    }
    return Memory{memory.used, memory.total};
  }

  absl::StatusOr<std::vector<pid_t>> ReadProcesses(int index) override {
    std::vector<pid_t> pids;
    for (nvmlDeviceGetProcesses_fn query : {compute_, graphics_}) {
      if (query == nullptr) continue;
      std::vector<nvmlProcessInfo_t> infos(kProcessesFirst);
      unsigned count = static_cast<unsigned>(infos.size());
      nvmlReturn_t rc = query(devices_.at(index), &count, infos.data());
      for (int grow = 0; rc == NVML_ERROR_INSUFFICIENT_SIZE && grow < kMaxGrow; ++grow) {
        infos.resize(std::max<size_t>(count + 16, infos.size() * 2));
        count = static_cast<unsigned>(infos.size());
        rc = query(devices_.at(index), &count, infos.data());
      }
      if (rc == NVML_ERROR_NOT_SUPPORTED && query == graphics_) continue;
      if (rc != NVML_SUCCESS) {
        return absl::UnavailableError(absl::StrCat("the device's process list: ", Error(rc)));
      }
      for (unsigned i = 0; i < count && i < infos.size(); ++i) {
        pids.push_back(static_cast<pid_t>(infos[i].pid));
      }
    }
    std::sort(pids.begin(), pids.end());
    pids.erase(std::unique(pids.begin(), pids.end()), pids.end());
    return pids;
  }

 private:
  explicit Nvml(void* library) : library_(library) {}

  absl::Status Bind() {
    init_ = Symbol<nvmlInit_v2_fn>(library_, "nvmlInit_v2");
    shutdown_ = Symbol<nvmlShutdown_fn>(library_, "nvmlShutdown");
    error_ = Symbol<nvmlErrorString_fn>(library_, "nvmlErrorString");
    count_ = Symbol<nvmlDeviceGetCount_v2_fn>(library_, "nvmlDeviceGetCount_v2");
    handle_ = Symbol<nvmlDeviceGetHandleByIndex_v2_fn>(library_, "nvmlDeviceGetHandleByIndex_v2");
    uuid_ = Symbol<nvmlDeviceGetUUID_fn>(library_, "nvmlDeviceGetUUID");
    memory_ = Symbol<nvmlDeviceGetMemoryInfo_fn>(library_, "nvmlDeviceGetMemoryInfo");
    rates_ = Symbol<nvmlDeviceGetUtilizationRates_fn>(library_, "nvmlDeviceGetUtilizationRates");
    samples_ = Symbol<nvmlDeviceGetSamples_fn>(library_, "nvmlDeviceGetSamples");
    compute_ =
        Symbol<nvmlDeviceGetProcesses_fn>(library_, "nvmlDeviceGetComputeRunningProcesses_v3");
    graphics_ =
        Symbol<nvmlDeviceGetProcesses_fn>(library_, "nvmlDeviceGetGraphicsRunningProcesses_v3");
    if (init_ == nullptr || count_ == nullptr || handle_ == nullptr || uuid_ == nullptr ||
        memory_ == nullptr || rates_ == nullptr || compute_ == nullptr) {
      return absl::UnavailableError(
          "the NVML library lacks a call muster needs (a driver older than 510?)");
    }
    return absl::OkStatus();
  }

  void BindHealth() {
    ecc_ = Symbol<nvmlDeviceGetTotalEccErrors_fn>(library_, "nvmlDeviceGetTotalEccErrors");
    pages_pending_ = Symbol<nvmlDeviceGetRetiredPagesPendingStatus_fn>(
        library_, "nvmlDeviceGetRetiredPagesPendingStatus");
    remapped_ = Symbol<nvmlDeviceGetRemappedRows_fn>(library_, "nvmlDeviceGetRemappedRows");
    event_create_ = Symbol<nvmlEventSetCreate_fn>(library_, "nvmlEventSetCreate");
    register_ = Symbol<nvmlDeviceRegisterEvents_fn>(library_, "nvmlDeviceRegisterEvents");
    event_wait_ = Symbol<nvmlEventSetWait_v2_fn>(library_, "nvmlEventSetWait_v2");
    event_free_ = Symbol<nvmlEventSetFree_fn>(library_, "nvmlEventSetFree");
  }

  // Critical Xids of every device into one event set; none where the
  // library or the boards cannot (the health reads still run).
  void ListenForXids() {
    if (event_create_ == nullptr || register_ == nullptr || event_wait_ == nullptr ||
        event_create_(&events_) != NVML_SUCCESS) {
      events_ = nullptr;
      return;
    }
    int registered = 0;
    for (nvmlDevice_t device : devices_) {
      if (register_(device, NVML_EVENT_TYPE_XID_CRITICAL_ERROR, events_) == NVML_SUCCESS) {
        ++registered;
      }
    }
    if (registered == 0) {
      if (event_free_ != nullptr) event_free_(events_);
      events_ = nullptr;
    }
  }

  std::string Error(nvmlReturn_t rc) const {
    const char* text = error_ != nullptr ? error_(rc) : nullptr;
    return text != nullptr ? absl::StrCat(text, " (", rc, ")") : absl::StrCat("error ", rc);
  }

  static int Percent(int type, const nvmlValue_t& value) {
    switch (type) {
      case NVML_VALUE_TYPE_DOUBLE: return static_cast<int>(value.dVal);
      case NVML_VALUE_TYPE_UNSIGNED_LONG: return static_cast<int>(value.ulVal);
      case NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: return static_cast<int>(value.ullVal);
      case NVML_VALUE_TYPE_SIGNED_LONG_LONG: return static_cast<int>(value.sllVal);
      case NVML_VALUE_TYPE_SIGNED_INT: return value.siVal;
      default: return static_cast<int>(value.uiVal);
    }
  }

  void* library_;
  bool initialized_ = false;
  bool samples_supported_ = true;
  std::vector<nvmlDevice_t> devices_;
  std::vector<std::string> uuids_;
  nvmlInit_v2_fn init_ = nullptr;
  nvmlShutdown_fn shutdown_ = nullptr;
  nvmlErrorString_fn error_ = nullptr;
  nvmlDeviceGetCount_v2_fn count_ = nullptr;
  nvmlDeviceGetHandleByIndex_v2_fn handle_ = nullptr;
  nvmlDeviceGetUUID_fn uuid_ = nullptr;
  nvmlDeviceGetMemoryInfo_fn memory_ = nullptr;
  nvmlDeviceGetUtilizationRates_fn rates_ = nullptr;
  nvmlDeviceGetSamples_fn samples_ = nullptr;
  nvmlDeviceGetProcesses_fn compute_ = nullptr;
  nvmlDeviceGetProcesses_fn graphics_ = nullptr;
  nvmlDeviceGetTotalEccErrors_fn ecc_ = nullptr;
  nvmlDeviceGetRetiredPagesPendingStatus_fn pages_pending_ = nullptr;
  nvmlDeviceGetRemappedRows_fn remapped_ = nullptr;
  nvmlEventSetCreate_fn event_create_ = nullptr;
  nvmlDeviceRegisterEvents_fn register_ = nullptr;
  nvmlEventSetWait_v2_fn event_wait_ = nullptr;
  nvmlEventSetFree_fn event_free_ = nullptr;
  nvmlEventSet_t events_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuSource>> OpenNvml(const std::string& library) {
  return Nvml::Open(library);
}

pid_t ParentPid(pid_t pid) {
  const std::string stat = ReadProcFile(absl::StrCat("/proc/", pid, "/stat"));
  const std::vector<absl::string_view> fields = ProcStatFields(stat);
  int parent = 0;
  if (fields.size() < 2 || !absl::SimpleAtoi(fields[1], &parent)) return 0;
  return parent;
}

}  // namespace muster
