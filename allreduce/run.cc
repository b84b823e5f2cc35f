#include "allreduce/run.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allreduce/bootstrap.h"
#include "allreduce/env.h"
#include "allreduce/gather.h"
#include "allreduce/host_runner.h"
#include "allreduce/net.h"
#include "allreduce/report.h"
#include "allreduce/runner.h"
#include "allreduce/shm_ring.h"
#include "allreduce/sweep.h"
#include "allreduce/tcp_ring.h"
#include "common/process_env.h"
#include "common/status.h"
#ifdef MUSTER_HAVE_NCCL
#include "allreduce/nccl_backend.h"
#endif

namespace muster::allreduce {
namespace {

// This boot of this machine, and the /dev/shm this rank sees: ranks with the
// same can share memory. Containers on one machine (pods on one node) share
// the boot but each may have its own /dev/shm, where a segment of rank 0's
// is not there for the others.
std::string MachineId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  struct stat shm {};
  // Without /dev/shm, no rank shares memory with another: an id of its own.
  if (stat("/dev/shm", &shm) != 0) return absl::StrCat(id, " without /dev/shm, pid ", getpid());
  return absl::StrCat(id, " /dev/shm ", shm.st_dev, ":", shm.st_ino);
}

// The ring's two connections: to the next rank (which this rank opens) and
// from the previous one (which it accepts, checking who it is).
absl::StatusOr<TcpRing> ConnectRing(const WorkerEnv& env, const Welcome& welcome,
                                    Listener& listener, absl::Duration timeout) {
  const int n = env.world_size;
  if (n == 1) return TcpRing(0, 1, UniqueFd(), UniqueFd(), timeout, "", "");
  const int next = (env.rank + 1) % n, prev = (env.rank + n - 1) % n;
  const absl::Time deadline = absl::Now() + timeout;
  const Peer& to = welcome.peers(next);
  absl::StatusOr<UniqueFd> out = Connect(to.addr(), to.ring_port(), deadline);
  if (!out.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot open the ring to ", RankName(welcome, next),
                                               ": ", out.status().message()));
  }
  const int32_t me = env.rank;
  MUSTER_RETURN_IF_ERROR(SendAll(out->get(), &me, sizeof me, deadline));
  absl::StatusOr<UniqueFd> in = Accept(listener.fd.get(), deadline);
  if (!in.ok()) {
    return absl::DeadlineExceededError(absl::StrCat(
        RankName(welcome, prev), " never opened its ring connection: ", in.status().message()));
  }
  int32_t from = -1;
  MUSTER_RETURN_IF_ERROR(RecvAll(in->get(), &from, sizeof from, deadline));
  if (from != prev) {
    return absl::InternalError(
        absl::StrCat("ring connection from rank ", from, ", expected ", prev));
  }
  TuneForBulk(out->get());
  TuneForBulk(in->get());
  return TcpRing(env.rank, n, *std::move(out), *std::move(in), timeout, RankName(welcome, next),
                 RankName(welcome, prev));
}

int Fail(const WorkerEnv& env, const absl::Status& status) {
  std::fprintf(stderr, "muster-allreduce: rank %d: error: %s\n", env.rank,
               std::string(status.message()).c_str());
  return absl::IsInvalidArgument(status) ? kExitUsage : kExitWrong;
}

// What this rank brings to the run besides its environment: the sizes, its
// GPU, its ring's listener, the shared memory rank 0 makes.
struct Local {
  DataType dtype = DataType::kFloat;
  std::vector<SweepSize> sweep;
  int64_t buffer_bytes = 0;
  absl::Duration timeout;
#ifdef MUSTER_HAVE_NCCL
  GpuInfo gpu;
#endif
  std::optional<Listener> ring_listener;
  std::optional<SharedMemoryAllReduce> shm;
};

// The sizes and the type, parsed; every rank must run the same sweep.
absl::Status PlanSweep(const AllReduceOptions& options, Local* local) {
  absl::StatusOr<DataType> dtype = ParseDataType(options.dtype);
  absl::StatusOr<int64_t> min_bytes = ParseBytes(options.min_bytes);
  absl::StatusOr<int64_t> max_bytes = ParseBytes(options.max_bytes);
  for (const absl::Status& s : {dtype.status(), min_bytes.status(), max_bytes.status()}) {
    if (!s.ok()) return s;
  }
  absl::StatusOr<std::vector<SweepSize>> sweep =
      SizeSweep(*min_bytes, *max_bytes, options.factor, *dtype);
  if (!sweep.ok()) return sweep.status();
  local->dtype = *dtype;
  local->sweep = *std::move(sweep);
  local->buffer_bytes = local->sweep.back().bytes;
  local->timeout = absl::Seconds(options.timeout_s);
  return absl::OkStatus();
}

// This rank's hello to rank 0, and how it bootstraps: its GPU (where the
// backend may use one), its ring's port, the shared memory it would make.
absl::Status PrepareBootstrap(const WorkerEnv& env, const AllReduceOptions& options, Local& local,
                              Hello* me, BootstrapOptions* bootstrap) {
  me->set_rank(env.rank);
  me->set_world_size(env.world_size);
  me->set_host(HostName());
  me->set_machine(MachineId());
  me->set_job(env.job);
  // Every rank must run the same sweep; rank 0 compares.
  me->set_sweep(absl::StrCat("-b ", options.min_bytes, " -e ", options.max_bytes, " -f ",
                             options.factor, " -d ", options.dtype, " -n ", options.iterations,
                             " -w ", options.warmup));
  bootstrap->backend = options.backend;
  bootstrap->timeout = local.timeout;
#ifdef MUSTER_HAVE_NCCL
  // The CPU backends leave the GPUs alone.
  absl::StatusOr<GpuInfo> gpu = MayUseGpu(options.backend) ? ProbeGpu(env.local_rank) : GpuInfo{};
  if (!gpu.ok()) return gpu.status();
  local.gpu = *gpu;
  me->set_bus_id(local.gpu.bus_id);
  me->set_can_nccl(local.gpu.present);
  // A GPU is set up, and NCCL picks it, only where every rank has one.
  bootstrap->make_nccl_id = [&local] { return NewNcclId(local.gpu.device); };
#endif
  // Test hook: a fake GPU bus id, to prove the duplicate-GPU check on CPUs.
  if (std::optional<std::string> fake = GetEnv("MUSTER_ALLREDUCE_TEST_BUS_ID")) {
    me->set_bus_id(*fake);
  }
  bootstrap->create_shm = [&local, &env](const std::string& name) -> absl::Status {
    absl::StatusOr<SharedMemoryAllReduce> created =
        SharedMemoryAllReduce::Create(name, env.world_size, local.buffer_bytes);
    if (!created.ok()) return created.status();
    local.shm.emplace(*std::move(created));
    return absl::OkStatus();
  };
  absl::StatusOr<Listener> ring_listener = Listen(0);
  if (!ring_listener.ok()) return ring_listener.status();
  me->set_ring_port(ring_listener->port);
  local.ring_listener.emplace(*std::move(ring_listener));
  return absl::OkStatus();
}

// The runner of the backend rank 0 chose.
absl::StatusOr<std::unique_ptr<Runner>> MakeRunner(const WorkerEnv& env, const Welcome& welcome,
                                                   const RunnerOptions& runner_options,
                                                   Local& local) {
  absl::StatusOr<Backend> backend = ParseBackend(welcome.backend());
  if (!backend.ok()) {
    return absl::InternalError(absl::StrCat("rank 0 chose ", backend.status().message()));
  }
  const absl::Duration timeout = local.timeout;
  if (*backend == Backend::kTcp) {
    absl::StatusOr<TcpRing> ring = ConnectRing(env, welcome, *local.ring_listener, timeout);
    if (!ring.ok()) return ring.status();
    auto shared = std::make_shared<TcpRing>(*std::move(ring));
    return std::make_unique<HostRunner>(
        [shared](void* data, int64_t count, DataType type) {
          return shared->AllReduce(data, count, type);
        },
        env, runner_options, local.buffer_bytes);
  }
  if (*backend == Backend::kShm) {
    if (env.rank != 0) {
      absl::StatusOr<SharedMemoryAllReduce> opened = SharedMemoryAllReduce::Open(
          welcome.shm_name(), env.rank, env.world_size, local.buffer_bytes);
      if (!opened.ok()) return opened.status();
      local.shm.emplace(*std::move(opened));
    }
    local.shm->rank_name = [&welcome](int r) { return RankName(welcome, r); };
    MUSTER_RETURN_IF_ERROR(local.shm->Attached(timeout));
    std::optional<SharedMemoryAllReduce>& shm = local.shm;
    return std::make_unique<HostRunner>(
        [&shm, timeout](void* data, int64_t count, DataType type) {
          return shm->AllReduce(data, count, type, timeout);
        },
        env, runner_options, local.buffer_bytes);
  }
#ifdef MUSTER_HAVE_NCCL
  return NewNcclRunner(env, welcome, local.gpu, local.buffer_bytes, runner_options, timeout);
#else
  return absl::InternalError("rank 0 chose NCCL, which this build does not have");
#endif
}

// Rank 0's header: the ranks, where each runs, the sizes.
void PrintHeader(const WorkerEnv& env, const Welcome& welcome, const AllReduceOptions& options,
                 const RunSummary& summary) {
  std::printf(
      "# muster-allreduce: %d ranks, backend %s, sizes %s to %s (x%d), %d warm-up and "
      "%d timed iterations each\n",
      env.world_size, welcome.backend().c_str(), options.min_bytes.c_str(),
      options.max_bytes.c_str(), options.factor, options.warmup, options.iterations);
  for (int r = 0; r < env.world_size; ++r) {
    std::printf("#  rank %3d on %s, %s\n", r, summary.hosts[r].c_str(),
                summary.devices[r] == "cpu" ? "cpu" : ("GPU " + summary.devices[r]).c_str());
  }
  std::printf("#\n%s", TableHeader().c_str());
  std::fflush(stdout);
}

// Every size, on every rank: the others send rank 0 their results, and
// rank 0 prints each size's row. A failure's exit status, or none.
std::optional<int> RunSweep(const WorkerEnv& env, const Local& local, const Welcome& welcome,
                            const Bootstrapped& boot, Runner& runner, RunSummary* summary) {
  const absl::Duration report_timeout = local.timeout;
  for (const SweepSize& size : local.sweep) {
    absl::StatusOr<LocalResult> result = runner.Run(size, local.dtype);
    SizeReport report;
    if (result.ok()) {
      report.set_time_us(result->time_us);
      report.set_wrong(result->wrong);
      report.set_inplace_time_us(result->inplace_time_us);
      report.set_inplace_wrong(result->inplace_wrong);
    } else {
      report.set_error(std::string(result.status().message()));
    }
    if (env.rank != 0) {
      SendMessage(boot.root.get(), report, absl::Now() + report_timeout).IgnoreError();
      if (!result.ok()) return Fail(env, result.status());
      continue;
    }
    if (!result.ok()) return Fail(env, result.status());
    SizeResult row = OwnRow(size, local.dtype, *result);
    for (int r = 1; r < env.world_size; ++r) {
      SizeReport theirs;
      absl::Status got = RecvMessage(boot.ranks[r].get(), &theirs, absl::Now() + report_timeout);
      if (!got.ok()) {
        return Fail(env, absl::UnavailableError(
                             absl::StrCat(RankName(welcome, r), " sent no results for ", size.bytes,
                                          " bytes: ", got.message(),
                                          absl::IsUnavailable(got) ? " (it died or failed)" : "")));
      }
      if (absl::Status added = AddReport(theirs, RankName(welcome, r), row); !added.ok()) {
        return Fail(env, added);
      }
    }
    AverageTimes(env.world_size, row);
    std::printf("%s", TableRow(row, env.world_size).c_str());
    std::fflush(stdout);
    summary->results.push_back(row);
  }
  return std::nullopt;
}

// A rank other than 0: its exit status is rank 0's verdict on the results.
int FollowVerdict(const WorkerEnv& env, const Local& local, const Bootstrapped& boot,
                  Runner& runner) {
  if (absl::Status finished = runner.Finish(); !finished.ok()) return Fail(env, finished);
  Verdict verdict;
  if (absl::Status got = RecvMessage(boot.root.get(), &verdict, absl::Now() + local.timeout);
      !got.ok()) {
    return Fail(env, absl::UnavailableError(
                         absl::StrCat("rank 0 gave no verdict on the results: ", got.message(),
                                      absl::IsUnavailable(got) ? " (it died or failed)" : "")));
  }
  if (verdict.exit_code() != 0) {
    std::fprintf(stderr, "muster-allreduce: rank %d: rank 0 says: %s\n", env.rank,
                 verdict.why().c_str());
  }
  return verdict.exit_code();
}

// Rank 0: the totals, the JSON, and the verdict, sent to every rank.
int Conclude(const WorkerEnv& env, const AllReduceOptions& options, const Local& local,
             const Welcome& welcome, const Bootstrapped& boot, Runner& runner,
             const RunSummary& summary) {
  const int64_t wrong = WrongValues(summary.results);
  std::printf("# Wrong values         : %lld %s\n", static_cast<long long>(wrong),
              wrong == 0 ? "OK" : "FAILED");
  std::printf("# Avg bus bandwidth    : %.4f GB/s\n",
              AverageBusBandwidth(summary.results, env.world_size));
  bool written = true;
  if (!options.json.empty()) {
    std::ofstream out(options.json);
    out << JsonReport(summary);
    written = static_cast<bool>(out);
    if (!written) std::fprintf(stderr, "muster-allreduce: cannot write %s\n", options.json.c_str());
  }
  // After the verdict and the JSON, so that a failure here loses neither.
  absl::Status finished = runner.Finish();
  Verdict verdict;
  if (!finished.ok()) {
    verdict.set_why(std::string(finished.message()));
  } else if (wrong != 0) {
    verdict.set_why(absl::StrCat(wrong, " wrong values: the all-reduce is broken"));
  } else if (!written) {
    verdict.set_why(absl::StrCat("rank 0 could not write ", options.json));
  }
  verdict.set_exit_code(verdict.why().empty() ? 0 : kExitWrong);
  // Said and flushed before the others hear it: a launcher that sees
  // another rank exit may stop this one at once.
  int code = verdict.exit_code();
  if (!finished.ok()) {
    code = Fail(env, finished);
    verdict.set_exit_code(code);
  } else if (wrong != 0) {
    std::fprintf(stderr, "muster-allreduce: %s\n", verdict.why().c_str());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  // Every rank's exit status tells the outcome; one that left already
  // (its launcher stopped it) is no reason to fail the run. Other hosts'
  // ranks first: this host's launcher may stop this rank as soon as one
  // of its own ranks exits.
  for (bool same_host : {false, true}) {
    for (int r = 1; r < env.world_size; ++r) {
      if ((welcome.peers(r).host() == welcome.peers(0).host()) != same_host) continue;
      SendMessage(boot.ranks[r].get(), verdict, absl::Now() + local.timeout).IgnoreError();
    }
  }
  return code;
}

}  // namespace

int RunAllReduce(const AllReduceOptions& options) {
  absl::StatusOr<WorkerEnv> env = ReadWorkerEnv(GetEnv);
  if (!env.ok()) {
    std::fprintf(stderr, "muster-allreduce: error: %s\n",
                 std::string(env.status().message()).c_str());
    return kExitUsage;
  }
  if (env->rank == 0 && !env->under.empty()) {
    std::fprintf(stderr, "muster-allreduce: %s\n", env->under.c_str());
  }
  Local local;
  if (absl::Status planned = PlanSweep(options, &local); !planned.ok()) return Fail(*env, planned);
  Hello me;
  BootstrapOptions bootstrap_options;
  if (absl::Status prepared = PrepareBootstrap(*env, options, local, &me, &bootstrap_options);
      !prepared.ok()) {
    return Fail(*env, prepared);
  }
  absl::StatusOr<Bootstrapped> boot = Bootstrap(*env, me, bootstrap_options);
  if (!boot.ok()) return Fail(*env, boot.status());
  const Welcome& welcome = boot->welcome;
  RunnerOptions runner_options;
  runner_options.warmup = options.warmup;
  runner_options.iterations = options.iterations;
  // Test hook: this rank spoils its result, to prove wrong values are caught.
  runner_options.corrupt_rank =
      std::atoi(GetEnv("MUSTER_ALLREDUCE_TEST_CORRUPT_RANK").value_or("-1").c_str());
  absl::StatusOr<std::unique_ptr<Runner>> runner = MakeRunner(*env, welcome, runner_options, local);
  if (!runner.ok()) return Fail(*env, runner.status());
  local.ring_listener->fd.reset();

  RunSummary summary;
  summary.backend = welcome.backend();
  summary.world_size = env->world_size;
  for (const Peer& peer : welcome.peers()) {
    summary.hosts.push_back(peer.host());
    summary.devices.push_back(peer.bus_id().empty() ? "cpu" : peer.bus_id());
  }
  if (env->rank == 0) PrintHeader(*env, welcome, options, summary);
  if (std::optional<int> failed = RunSweep(*env, local, welcome, *boot, **runner, &summary)) {
    return *failed;
  }
  if (env->rank != 0) return FollowVerdict(*env, local, *boot, **runner);
  return Conclude(*env, options, local, welcome, *boot, **runner, summary);
}

}  // namespace muster::allreduce
