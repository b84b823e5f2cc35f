#include "allreduce/bootstrap.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allreduce/gather.h"
#include "common/endpoint.h"
#include "common/status.h"

namespace muster::allreduce {
namespace {

// Tells the rank at `fd` that it is refused, and why; it stops with `status`.
void Refuse(int fd, const absl::Status& status, absl::Time deadline) {
  Welcome refused;
  refused.set_error(std::string(status.message()));
  refused.set_error_code(static_cast<int>(status.code()));
  SendMessage(fd, refused, deadline).IgnoreError();
}

// Tells every rank that arrived, then returns the error itself.
absl::Status FailAll(std::vector<UniqueFd>& ranks, const absl::Status& status) {
  for (UniqueFd& fd : ranks) {
    if (fd.valid()) Refuse(fd.get(), status, absl::Now() + absl::Seconds(2));
  }
  return status;
}

absl::StatusOr<Bootstrapped> RootBootstrap(const WorkerEnv& env, const Hello& me,
                                           const BootstrapOptions& options) {
  Bootstrapped out;
  out.ranks.resize(env.world_size);
  std::vector<Hello> hellos(env.world_size);
  hellos[0] = me;
  std::vector<std::string> addrs(env.world_size);
  addrs[0] = env.master_addr;
  const std::string root_endpoint = FormatEndpoint(env.master_addr, env.bootstrap_port);
  if (env.world_size > 1) {
    absl::StatusOr<Listener> listener = Listen(env.bootstrap_port);
    if (!listener.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank 0 cannot listen on ", BootstrapPortName(env), ": ", listener.status().message(),
          env.agent_store ? "; pick a master port whose next port is free too"
                          : "; pick a free port"));
    }
    const absl::Time deadline = absl::Now() + options.timeout;
    std::vector<bool> arrived(env.world_size, false);
    arrived[0] = true;
    int count = 1;
    while (count < env.world_size) {
      absl::StatusOr<UniqueFd> fd = Accept(listener->fd.get(), deadline);
      if (!fd.ok()) {
        std::vector<int> missing;
        for (int r = 1; r < env.world_size; ++r) {
          if (!arrived[r]) missing.push_back(r);
        }
        return FailAll(
            out.ranks,
            absl::DeadlineExceededError(absl::StrCat(
                missing.size() == 1 ? "rank " : "ranks ", absl::StrJoin(missing, ", "),
                " never reached rank 0 at ", root_endpoint, " within ",
                absl::FormatDuration(options.timeout), " (", count, " of ", env.world_size,
                " ranks arrived); is every rank started with the same MASTER_ADDR and "
                "MASTER_PORT?")));
      }
      // A connection that says nothing in a few seconds is not one of ours.
      Hello hello;
      if (!RecvMessage(fd->get(), &hello, std::min(deadline, absl::Now() + absl::Seconds(5)))
               .ok()) {
        continue;
      }
      const HelloCheck check = CheckHello(me, hello, arrived, root_endpoint);
      if (check.verdict == HelloVerdict::kTurnAway) {
        // Another job's rank, at a port it should not share with this one:
        // turned away, and this job goes on.
        Refuse(fd->get(), check.reason, std::min(deadline, absl::Now() + absl::Seconds(2)));
        std::fprintf(stderr,
                     "muster-allreduce: turned away rank %d of %s, which reached this "
                     "job's port\n",
                     hello.rank(), JobName(hello.job()).c_str());
        continue;
      }
      if (check.verdict == HelloVerdict::kStopJob) {
        Refuse(fd->get(), check.reason, deadline);
        return FailAll(out.ranks, check.reason);
      }
      addrs[hello.rank()] = PeerAddress(fd->get());
      hellos[hello.rank()] = hello;
      out.ranks[hello.rank()] = *std::move(fd);
      arrived[hello.rank()] = true;
      ++count;
    }
  }

  absl::StatusOr<Welcome> planned = PlanWelcome(hellos, addrs, options.backend);
  if (!planned.ok()) return FailAll(out.ranks, planned.status());
  out.welcome = *std::move(planned);
  Welcome& welcome = out.welcome;
  if (welcome.backend() == BackendName(Backend::kNccl)) {
    absl::StatusOr<std::string> id = options.make_nccl_id();
    if (!id.ok()) return FailAll(out.ranks, id.status());
    welcome.set_nccl_id(*id);
  }
  if (welcome.backend() == BackendName(Backend::kShm)) {
    welcome.set_shm_name(absl::StrCat("/muster-allreduce-", getpid(), "-", env.master_port, "-",
                                      absl::Hex(absl::ToUnixNanos(absl::Now()))));
    if (absl::Status created = options.create_shm(welcome.shm_name()); !created.ok()) {
      if (options.backend == Backend::kShm) return FailAll(out.ranks, created);
      // auto: a small /dev/shm (containers) is no reason to fail.
      std::fprintf(stderr, "muster-allreduce: %s; using the TCP backend instead\n",
                   std::string(created.message()).c_str());
      welcome.set_backend(BackendName(Backend::kTcp));
      welcome.clear_shm_name();
    }
  }
  const absl::Time deadline = absl::Now() + options.timeout;
  for (int r = 1; r < env.world_size; ++r) {
    if (absl::Status sent = SendMessage(out.ranks[r].get(), welcome, deadline); !sent.ok()) {
      return FailAll(out.ranks, absl::UnavailableError(absl::StrCat(
                                    RankName(welcome, r),
                                    " went away during the bootstrap: ", sent.message())));
    }
  }
  return out;
}

}  // namespace

std::string RankName(const Welcome& welcome, int rank) {
  if (rank >= 0 && rank < welcome.peers_size()) {
    return absl::StrCat("rank ", rank, " (", welcome.peers(rank).host(), ")");
  }
  return absl::StrCat("rank ", rank);
}

absl::StatusOr<Bootstrapped> Bootstrap(const WorkerEnv& env, const Hello& me,
                                       const BootstrapOptions& options) {
  if (env.rank == 0) return RootBootstrap(env, me, options);
  Bootstrapped out;
  const absl::Time deadline = absl::Now() + options.timeout;
  absl::StatusOr<UniqueFd> root = Connect(env.master_addr, env.bootstrap_port, deadline);
  if (!root.ok()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "rank ", env.rank, " cannot reach rank 0 at MASTER_ADDR ", env.master_addr, ", ",
        BootstrapPortName(env), ": ", root.status().message(), "; is rank 0 running?"));
  }
  MUSTER_RETURN_IF_ERROR(SendMessage(root->get(), me, deadline));
  // Rank 0 may wait out its own timeout for the last rank, then answer.
  absl::Status got = RecvMessage(root->get(), &out.welcome, deadline + options.timeout);
  if (!got.ok()) {
    return absl::UnavailableError(absl::StrCat("rank ", env.rank, " got no answer from rank 0 at ",
                                               FormatEndpoint(env.master_addr, env.bootstrap_port),
                                               ": ", got.message()));
  }
  if (!out.welcome.error().empty()) {
    const auto code = static_cast<absl::StatusCode>(out.welcome.error_code());
    return absl::Status(code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : code,
                        absl::StrCat("rank 0 stopped the job: ", out.welcome.error()));
  }
  out.root = *std::move(root);
  return out;
}

}  // namespace muster::allreduce
