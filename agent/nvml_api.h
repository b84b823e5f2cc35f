// The part of NVML's C API that muster uses, declared from NVIDIA's NVML
// API reference (Debian's main archive ships no nvml.h). Shared by the
// loader (nvml.cc) and the tests' fake library (tests/tools/fake_nvml.cc).
// The layouts are NVML's and must stay so: the static_asserts pin the
// sizes the reference gives.
#ifndef MUSTER_AGENT_NVML_API_H_
#define MUSTER_AGENT_NVML_API_H_

extern "C" {

typedef struct nvmlDevice_st* nvmlDevice_t;
typedef int nvmlReturn_t;  // an enum in nvml.h

enum : int {
  NVML_SUCCESS = 0,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_TIMEOUT = 10,
  NVML_ERROR_GPU_IS_LOST = 15,
};

// nvmlMemoryErrorType_t's NVML_MEMORY_ERROR_TYPE_UNCORRECTED, and
// nvmlEccCounterType_t's NVML_VOLATILE_ECC (since the driver loaded).
enum : int { NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1, NVML_VOLATILE_ECC = 0 };

// The event a critical Xid raises (nvmlEventTypeXidCriticalError).
enum : unsigned long long { NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x8 };

// nvmlSamplingType_t's NVML_GPU_UTILIZATION_SAMPLES.
enum : int { NVML_GPU_UTILIZATION_SAMPLES = 1 };

// nvmlValueType_t.
enum : int {
  NVML_VALUE_TYPE_DOUBLE = 0,
  NVML_VALUE_TYPE_UNSIGNED_INT = 1,
  NVML_VALUE_TYPE_UNSIGNED_LONG = 2,
  NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3,
  NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4,
  NVML_VALUE_TYPE_SIGNED_INT = 5,
};

// NVML_DEVICE_UUID_V2_BUFFER_SIZE.
enum : unsigned { NVML_DEVICE_UUID_BUFFER = 96 };

typedef union {
  double dVal;
  int siVal;
  unsigned int uiVal;
  unsigned long ulVal;
  unsigned long long ullVal;
  signed long long sllVal;
} nvmlValue_t;

typedef struct {
  unsigned long long timeStamp;  // microseconds since the Unix epoch
  nvmlValue_t sampleValue;
} nvmlSample_t;

typedef struct {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;

typedef struct {
  unsigned int gpu;     // percent of the last sample period a kernel ran
  unsigned int memory;  // percent of it device memory was read or written
} nvmlUtilization_t;

// nvmlProcessInfo_v2_t, what the _v3 process queries fill.
typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct nvmlEventSet_st* nvmlEventSet_t;

// nvmlEventData_t: for a critical Xid, eventData is the Xid.
typedef struct {
  nvmlDevice_t device;
  unsigned long long eventType;
  unsigned long long eventData;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
} nvmlEventData_t;

static_assert(sizeof(nvmlEventData_t) == 32);
static_assert(sizeof(nvmlValue_t) == 8);
static_assert(sizeof(nvmlSample_t) == 16);
static_assert(sizeof(nvmlMemory_t) == 24);
static_assert(sizeof(nvmlUtilization_t) == 8);
static_assert(sizeof(nvmlProcessInfo_t) == 24);

// The signatures, as pointer types for dlsym.
using nvmlInit_v2_fn = nvmlReturn_t (*)();
using nvmlShutdown_fn = nvmlReturn_t (*)();
using nvmlErrorString_fn = const char* (*)(nvmlReturn_t);
using nvmlDeviceGetCount_v2_fn = nvmlReturn_t (*)(unsigned int* count);
using nvmlDeviceGetHandleByIndex_v2_fn = nvmlReturn_t (*)(unsigned int index, nvmlDevice_t* device);
using nvmlDeviceGetUUID_fn = nvmlReturn_t (*)(nvmlDevice_t device, char* uuid, unsigned int length);
using nvmlDeviceGetMemoryInfo_fn = nvmlReturn_t (*)(nvmlDevice_t device, nvmlMemory_t* memory);
using nvmlDeviceGetUtilizationRates_fn = nvmlReturn_t (*)(nvmlDevice_t device,
                                                          nvmlUtilization_t* utilization);
using nvmlDeviceGetSamples_fn = nvmlReturn_t (*)(nvmlDevice_t device, int type,
                                                 unsigned long long lastSeenTimeStamp,
                                                 int* sampleValType, unsigned int* sampleCount,
                                                 nvmlSample_t* samples);
using nvmlDeviceGetProcesses_fn = nvmlReturn_t (*)(nvmlDevice_t device, unsigned int* infoCount,
                                                   nvmlProcessInfo_t* infos);
// Health (each optional: an older driver or another board may lack it).
using nvmlDeviceGetTotalEccErrors_fn = nvmlReturn_t (*)(nvmlDevice_t device, int errorType,
                                                        int counterType,
                                                        unsigned long long* eccCounts);
using nvmlDeviceGetRetiredPagesPendingStatus_fn = nvmlReturn_t (*)(nvmlDevice_t device,
                                                                   int* isPending);
using nvmlDeviceGetRemappedRows_fn = nvmlReturn_t (*)(nvmlDevice_t device, unsigned int* corrRows,
                                                      unsigned int* uncRows,
                                                      unsigned int* isPending,
                                                      unsigned int* failureOccurred);
using nvmlEventSetCreate_fn = nvmlReturn_t (*)(nvmlEventSet_t* set);
using nvmlDeviceRegisterEvents_fn = nvmlReturn_t (*)(nvmlDevice_t device,
                                                     unsigned long long eventTypes,
                                                     nvmlEventSet_t set);
using nvmlEventSetWait_v2_fn = nvmlReturn_t (*)(nvmlEventSet_t set, nvmlEventData_t* data,
                                                unsigned int timeoutms);
using nvmlEventSetFree_fn = nvmlReturn_t (*)(nvmlEventSet_t set);

}  // extern "C"

#endif  // MUSTER_AGENT_NVML_API_H_
