#include "allreduce/nccl_backend.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "allreduce/data.h"
#include "allreduce/watchdog.h"
#include "common/status.h"
#include "common/unique_handle.h"

namespace muster::allreduce {
namespace {

absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": CUDA error ", static_cast<int>(error), " (",
                                          cudaGetErrorString(error), ")"));
}

absl::Status NcclStatus(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": NCCL error ", static_cast<int>(result), " (",
                                          ncclGetErrorString(result), ")"));
}

#define MUSTER_CUDA(call) MUSTER_RETURN_IF_ERROR(CudaStatus((call), #call))
#define MUSTER_NCCL(call) MUSTER_RETURN_IF_ERROR(NcclStatus((call), #call))

ncclDataType_t NcclType(DataType type) {
  switch (type) {
    case DataType::kFloat: return ncclFloat32;
    case DataType::kHalf: return ncclFloat16;
    case DataType::kBfloat16: return ncclBfloat16;
    case DataType::kDouble: return ncclFloat64;
  }
  return ncclFloat32;
}

// Handles that CUDA and NCCL hand out, released when dropped. Create calls
// write into out().
using DeviceBuffer = UniqueHandle<void*, cudaFree>;
using Stream = UniqueHandle<cudaStream_t, cudaStreamDestroy>;
using Event = UniqueHandle<cudaEvent_t, cudaEventDestroy>;
// Held only on an error (Finish releases it for ncclCommDestroy): abort,
// which stops the kernels still waiting for a dead peer. ncclCommDestroy
// would wait for them.
using Comm = UniqueHandle<ncclComm_t, ncclCommAbort>;

// Collectives run between waits on the stream: a dead peer is found within
// the timeout of the group it stalls, and a long run is not one long wait.
constexpr int kOpsPerWait = 16;

// The watchdog's limit, past the timeout that the stream waits keep: they
// fail cleanly first where they can.
constexpr absl::Duration kWatchdogGrace = absl::Seconds(10);

class NcclRunner final : public Runner {
 public:
  NcclRunner(const WorkerEnv& env, const RunnerOptions& options, absl::Duration timeout)
      : env_(env), options_(options), timeout_(timeout),
        watchdog_(absl::StrCat("rank ", env.rank), timeout + kWatchdogGrace) {}

  ~NcclRunner() override {
    // An abort stops kernels waiting for a dead peer, but NCCL's own threads
    // have been seen to hang in it: the watchdog stays armed.
    if (comm_.valid()) watchdog_.Arm("aborting the NCCL communicator");
  }

  absl::Status Init(const Welcome& welcome, const GpuInfo& gpu, int64_t max_bytes) {
    MUSTER_CUDA(cudaSetDevice(gpu.device));
    MUSTER_CUDA(cudaStreamCreateWithFlags(stream_.out(), cudaStreamNonBlocking));
    MUSTER_CUDA(cudaEventCreate(start_.out()));
    MUSTER_CUDA(cudaEventCreate(stop_.out()));
    for (Event& done : group_done_) {
      MUSTER_CUDA(cudaEventCreateWithFlags(done.out(), cudaEventDisableTiming));
    }
    MUSTER_CUDA(cudaMalloc(send_.out(), static_cast<size_t>(max_bytes)));
    MUSTER_CUDA(cudaMalloc(recv_.out(), static_cast<size_t>(max_bytes)));
    host_.resize(static_cast<size_t>(max_bytes));
    ncclUniqueId id;
    if (welcome.nccl_id().size() != sizeof id.internal) {
      return absl::InternalError("rank 0 sent an NCCL id of the wrong size");
    }
    std::memcpy(id.internal, welcome.nccl_id().data(), sizeof id.internal);
    // A blocking communicator, as nccl-tests and PyTorch use: a non-blocking
    // one starts a thread per collective, which small sizes would time.
    // NCCL_COMM_BLOCKING=0 in the environment would override the default.
    // The join waits for every rank, and one may never come: the watchdog.
    setenv("NCCL_COMM_BLOCKING", "1", 1);
    watchdog_.Arm("joining the NCCL communicator");
    absl::Cleanup disarm = [this] { watchdog_.Disarm(); };
    return NcclStatus(ncclCommInitRank(comm_.out(), env_.world_size, id, env_.rank),
                      "ncclCommInitRank");
  }

  // Flushes what the last collectives left in flight (NCCL's proxies send on
  // after the kernels end), so that no rank leaves while a peer needs it.
  absl::Status Finish() override {
    watchdog_.Arm("finishing the NCCL communicator");
    absl::Cleanup disarm = [this] { watchdog_.Disarm(); };
    MUSTER_NCCL(ncclCommFinalize(comm_.get()));
    return NcclStatus(ncclCommDestroy(comm_.release()), "ncclCommDestroy");
  }

  absl::StatusOr<LocalResult> Run(const SweepSize& size, DataType type) override {
    LocalResult result;
    const size_t bytes = static_cast<size_t>(size.bytes);
    for (const bool inplace : {false, true}) {
      void* in = inplace ? recv_.get() : send_.get();
      // Copies go on the collective's stream, so that they are ordered with it.
      auto load = [&]() -> absl::Status {
        Fill(host_.data(), size.count, type, env_.rank, env_.world_size);
        MUSTER_CUDA(
            cudaMemcpyAsync(in, host_.data(), bytes, cudaMemcpyHostToDevice, stream_.get()));
        return Wait();
      };
      // Groups of collectives, each queued while the one before runs: the
      // host waits for the group before last, so the GPU never runs dry, and
      // a dead peer is found within the timeout of the group it stalls.
      // `stop`, when set, is recorded right after the last one. A blocking
      // call (the first of a size may connect to peers) cannot be
      // interrupted: the watchdog, past the waits' own deadline, per group.
      auto ops = [&](int count, cudaEvent_t stop) -> absl::Status {
        absl::Cleanup disarm = [this] { watchdog_.Disarm(); };
        for (int i = 0, group = 0; i < count; ++group) {
          watchdog_.Arm(absl::StrCat("an all-reduce of ", size.bytes, " bytes"));
          for (const int end = std::min(count, i + kOpsPerWait); i < end; ++i) {
            MUSTER_NCCL(ncclAllReduce(in, recv_.get(), size.count, NcclType(type), ncclSum,
                                      comm_.get(), stream_.get()));
          }
          MUSTER_CUDA(cudaEventRecord(group_done_[group % 2].get(), stream_.get()));
          if (group > 0) MUSTER_RETURN_IF_ERROR(Wait(group_done_[(group - 1) % 2].get()));
        }
        if (stop != nullptr) MUSTER_CUDA(cudaEventRecord(stop, stream_.get()));
        return Wait();
      };
      MUSTER_RETURN_IF_ERROR(load());
      // At least one untimed: NCCL connects to peers on first use.
      MUSTER_RETURN_IF_ERROR(ops(std::max(1, options_.warmup), nullptr));
      MUSTER_CUDA(cudaEventRecord(start_.get(), stream_.get()));
      MUSTER_RETURN_IF_ERROR(ops(options_.iterations, stop_.get()));
      float ms = 0;
      MUSTER_CUDA(cudaEventElapsedTime(&ms, start_.get(), stop_.get()));
      // The check: fresh values, one more all-reduce, the result to the host.
      MUSTER_RETURN_IF_ERROR(load());
      MUSTER_RETURN_IF_ERROR(ops(1, nullptr));
      MUSTER_CUDA(
          cudaMemcpyAsync(host_.data(), recv_.get(), bytes, cudaMemcpyDeviceToHost, stream_.get()));
      MUSTER_RETURN_IF_ERROR(Wait());
      if (options_.corrupt_rank == env_.rank) {
        Fill(host_.data(), 1, type, env_.rank + 1, env_.world_size);  // the test hook
      }
      const int64_t wrong = CountWrong(host_.data(), size.count, type, env_.world_size);
      (inplace ? result.inplace_time_us : result.time_us) =
          1000.0 * ms / std::max(1, options_.iterations);
      (inplace ? result.inplace_wrong : result.wrong) = wrong;
    }
    return result;
  }

 private:
  // The stream's work (or `event`'s), or an error: a peer that died shows as
  // an NCCL asynchronous error, or as no progress until the timeout. It
  // spins, as nccl-tests does: a sleep here would be in the times of small sizes.
  absl::Status Wait(cudaEvent_t event = nullptr) {
    const absl::Time deadline = absl::Now() + timeout_;
    while (true) {
      const cudaError_t state =
          event != nullptr ? cudaEventQuery(event) : cudaStreamQuery(stream_.get());
      if (state == cudaSuccess) return absl::OkStatus();
      if (state != cudaErrorNotReady) return CudaStatus(state, "the all-reduce");
      ncclResult_t async = ncclSuccess;
      MUSTER_NCCL(ncclCommGetAsyncError(comm_.get(), &async));
      if (async != ncclSuccess && async != ncclInProgress) {
        return NcclStatus(async, "the all-reduce (a peer failed?)");
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat("the all-reduce did not finish within ",
                                                        absl::FormatDuration(timeout_),
                                                        "; a rank may have died or hung"));
      }
      std::this_thread::yield();
    }
  }

  const WorkerEnv env_;
  const RunnerOptions options_;
  const absl::Duration timeout_;
  Watchdog watchdog_;  // destroyed after the others, so that it sees the abort through
  Stream stream_;
  Event start_, stop_;
  Event group_done_[2];
  DeviceBuffer send_, recv_;
  std::vector<char> host_;
  // Last: destroyed first. The abort stops kernels still waiting for a dead
  // peer; cudaFree on their buffers would wait for them for ever.
  Comm comm_;
};

}  // namespace

absl::StatusOr<GpuInfo> ProbeGpu(int local_rank) {
  GpuInfo info;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return info;  // no GPU here
  if (count == 1) local_rank = 0;  // this rank's own GPU, chosen by CUDA_VISIBLE_DEVICES
  if (local_rank >= count) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    return absl::InvalidArgumentError(absl::StrCat(
        "LOCAL_RANK=", local_rank, " but only ", count, " GPU(s) are visible",
        visible != nullptr ? absl::StrCat(" (CUDA_VISIBLE_DEVICES=", visible, ")") : "",
        "; start at most ", count, " workers on this node (--nproc-per-node gpu)"));
  }
  char bus_id[64] = "";
  MUSTER_CUDA(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, local_rank));
  info.present = true;
  info.device = local_rank;
  info.bus_id = bus_id;
  return info;
}

absl::StatusOr<std::string> NewNcclId(int device) {
  MUSTER_CUDA(cudaSetDevice(device));
  ncclUniqueId id;
  MUSTER_NCCL(ncclGetUniqueId(&id));
  return std::string(id.internal, sizeof id.internal);
}

absl::StatusOr<std::unique_ptr<Runner>> NewNcclRunner(const WorkerEnv& env, const Welcome& welcome,
                                                      const GpuInfo& gpu, int64_t max_bytes,
                                                      const RunnerOptions& options,
                                                      absl::Duration timeout) {
  auto runner = std::make_unique<NcclRunner>(env, options, timeout);
  MUSTER_RETURN_IF_ERROR(runner->Init(welcome, gpu, max_bytes));
  return runner;
}

}  // namespace muster::allreduce
