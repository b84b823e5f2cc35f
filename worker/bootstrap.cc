#include "worker/bootstrap.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "worker/devices.h"

namespace muster::worker {
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

std::string JobName(const std::string& job) { return job.empty() ? "a job with no id" : job; }

absl::StatusOr<Bootstrapped> RootBootstrap(const WorkerEnv& env, const Hello& me,
                                           const BootstrapOptions& options) {
  Bootstrapped out;
  out.ranks.resize(env.world_size);
  std::vector<Hello> hellos(env.world_size);
  hellos[0] = me;
  std::vector<std::string> addrs(env.world_size);
  addrs[0] = env.master_addr;
  if (env.world_size > 1) {
    absl::StatusOr<Listener> listener = Listen(env.bootstrap_port);
    if (!listener.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank 0 cannot listen on ", BootstrapPortName(env), ": ", listener.status().message(),
          env.agent_store ? "; pick a master port whose next port is free too" : "; pick a free port"));
    }
    const absl::Time deadline = absl::Now() + options.timeout;
    int arrived = 1;
    while (arrived < env.world_size) {
      absl::StatusOr<UniqueFd> fd = Accept(listener->fd.get(), deadline);
      if (!fd.ok()) {
        std::vector<int> missing;
        for (int r = 1; r < env.world_size; ++r) {
          if (!out.ranks[r].valid()) missing.push_back(r);
        }
        return FailAll(out.ranks, absl::DeadlineExceededError(absl::StrCat(
            missing.size() == 1 ? "rank " : "ranks ", absl::StrJoin(missing, ", "),
            " never reached rank 0 at ",
            env.master_addr, ":", env.bootstrap_port, " within ",
            absl::FormatDuration(options.timeout), " (", arrived, " of ", env.world_size,
            " ranks arrived); is every rank started with the same MASTER_ADDR and MASTER_PORT?")));
      }
      // A connection that says nothing in a few seconds is not one of ours.
      Hello hello;
      if (!RecvMessage(fd->get(), &hello, std::min(deadline, absl::Now() + absl::Seconds(5))).ok()) {
        continue;
      }
      // Another job's rank, at a port it should not share with this one:
      // turned away, and this job goes on.
      if (hello.job() != me.job()) {
        Refuse(fd->get(),
               absl::InvalidArgumentError(absl::StrCat(
                   "rank 0 at ", env.master_addr, ":", env.bootstrap_port, " belongs to ",
                   JobName(me.job()), ", not to ",
                   hello.job().empty() ? "this rank's job, which has no id" : hello.job(),
                   "; give each job its own MASTER_PORT")),
               std::min(deadline, absl::Now() + absl::Seconds(2)));
        std::fprintf(stderr, "muster-allreduce: turned away rank %d of %s, which reached this "
                     "job's port\n", hello.rank(), JobName(hello.job()).c_str());
        continue;
      }
      if (hello.world_size() != env.world_size || hello.rank() <= 0 ||
          hello.rank() >= env.world_size || out.ranks[hello.rank()].valid()) {
        const absl::Status refused = absl::InvalidArgumentError(absl::StrCat(
            "rank 0 (WORLD_SIZE ", env.world_size, ") cannot take a rank ", hello.rank(),
            " with WORLD_SIZE ", hello.world_size(),
            hello.rank() > 0 && hello.rank() < env.world_size ? " (it has that rank already)" : "",
            "; every rank needs the same WORLD_SIZE and its own RANK"));
        Refuse(fd->get(), refused, deadline);
        return FailAll(out.ranks, refused);
      }
      if (hello.sweep() != me.sweep()) {
        const absl::Status refused = absl::InvalidArgumentError(absl::StrCat(
            "rank ", hello.rank(), " (", hello.host(), ") runs '", hello.sweep(), "' but rank 0 runs '",
            me.sweep(), "'; give every rank the same options"));
        Refuse(fd->get(), refused, deadline);
        return FailAll(out.ranks, refused);
      }
      addrs[hello.rank()] = PeerAddress(fd->get());
      hellos[hello.rank()] = hello;
      out.ranks[hello.rank()] = *std::move(fd);
      ++arrived;
    }
  }

  std::vector<RankIdentity> identities;
  for (const Hello& h : hellos) identities.push_back({h.rank(), h.host(), h.bus_id()});
  if (absl::Status distinct = CheckDistinctDevices(identities); !distinct.ok()) {
    return FailAll(out.ranks, distinct);
  }
  std::vector<int> without_nccl, elsewhere;
  for (const Hello& h : hellos) {
    if (!h.can_nccl()) without_nccl.push_back(h.rank());
    if (h.machine().empty() || h.machine() != me.machine()) elsewhere.push_back(h.rank());
  }
  Welcome& welcome = out.welcome;
  if (options.backend == "nccl" && !without_nccl.empty()) {
    return FailAll(out.ranks, absl::InvalidArgumentError(absl::StrCat(
        "--backend nccl, but rank(s) ", absl::StrJoin(without_nccl, ", "),
        " have no GPU or no NCCL; use --backend tcp or auto")));
  }
  if (options.backend == "shm" && !elsewhere.empty()) {
    return FailAll(out.ranks, absl::InvalidArgumentError(absl::StrCat(
        "--backend shm, but rank(s) ", absl::StrJoin(elsewhere, ", "),
        " run on another machine than rank 0, or see another /dev/shm; use --backend tcp or auto")));
  }
  // auto: NCCL where every rank has a GPU, else shared memory on one
  // machine, else TCP.
  if (options.backend != "auto") {
    welcome.set_backend(options.backend);
  } else if (without_nccl.empty()) {
    welcome.set_backend("nccl");
  } else {
    welcome.set_backend(elsewhere.empty() && env.world_size > 1 ? "shm" : "tcp");
  }
  if (welcome.backend() == "nccl") {
    absl::StatusOr<std::string> id = options.make_nccl_id();
    if (!id.ok()) return FailAll(out.ranks, id.status());
    welcome.set_nccl_id(*id);
  }
  if (welcome.backend() == "shm") {
    welcome.set_shm_name(absl::StrCat("/muster-allreduce-", getpid(), "-", env.master_port, "-",
                                      absl::Hex(absl::ToUnixNanos(absl::Now()))));
    if (absl::Status created = options.create_shm(welcome.shm_name()); !created.ok()) {
      if (options.backend == "shm") return FailAll(out.ranks, created);
      // auto: a small /dev/shm (containers) is no reason to fail.
      std::fprintf(stderr, "muster-allreduce: %s; using the TCP backend instead\n",
                   std::string(created.message()).c_str());
      welcome.set_backend("tcp");
      welcome.clear_shm_name();
    }
  }
  for (int r = 0; r < env.world_size; ++r) {
    Peer* peer = welcome.add_peers();
    peer->set_rank(r);
    peer->set_host(hellos[r].host());
    peer->set_addr(addrs[r]);
    peer->set_ring_port(hellos[r].ring_port());
    peer->set_bus_id(hellos[r].bus_id());
  }
  const absl::Time deadline = absl::Now() + options.timeout;
  for (int r = 1; r < env.world_size; ++r) {
    if (absl::Status sent = SendMessage(out.ranks[r].get(), welcome, deadline); !sent.ok()) {
      return FailAll(out.ranks, absl::UnavailableError(absl::StrCat(
          RankName(welcome, r), " went away during the bootstrap: ", sent.message())));
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
                                               env.master_addr, ":", env.bootstrap_port, ": ",
                                               got.message()));
  }
  if (!out.welcome.error().empty()) {
    const auto code = static_cast<absl::StatusCode>(out.welcome.error_code());
    return absl::Status(code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : code,
                        absl::StrCat("rank 0 stopped the job: ", out.welcome.error()));
  }
  out.root = *std::move(root);
  return out;
}

}  // namespace muster::worker
