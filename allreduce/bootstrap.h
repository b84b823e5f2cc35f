// How the ranks of muster-allreduce find each other: rank 0 listens on
// MASTER_PORT (or MASTER_PORT+1, see WorkerEnv); every other rank connects (retrying until the
// timeout, as rank 0 may start last), says who it is, and gets back every rank's address, the
// backend, and the NCCL id. The connections to rank 0 stay open: each rank reports every size's
// results over its own.
#ifndef MUSTER_ALLREDUCE_BOOTSTRAP_H_
#define MUSTER_ALLREDUCE_BOOTSTRAP_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "allreduce/allreduce.pb.h"
#include "allreduce/backend.h"
#include "allreduce/env.h"
#include "allreduce/net.h"
#include "common/unique_handle.h"

namespace muster::allreduce {

struct BootstrapOptions {
  Backend backend = Backend::kAuto;
  absl::Duration timeout = absl::Seconds(60);
  // Rank 0, when the backend is NCCL: a fresh ncclUniqueId.
  std::function<absl::StatusOr<std::string>()> make_nccl_id;
  // Rank 0, when the backend is shared memory: creates the segment `name`
  // before the others are told to open it.
  std::function<absl::Status(const std::string& name)> create_shm;
};

struct Bootstrapped {
  Welcome welcome;
  std::vector<UniqueFd> ranks;  // rank 0: the connection to each rank (index 0 unused)
  UniqueFd root;                // other ranks: the connection to rank 0
};

// Rank 0's errors (a rank missing at the timeout, two ranks on one GPU, a
// rank that cannot use the asked backend) reach every rank that arrived,
// which returns them too. kInvalidArgument: the job is set up wrong (exit 2);
// other codes: a rank failed or never came.
absl::StatusOr<Bootstrapped> Bootstrap(const WorkerEnv& env, const Hello& me,
                                       const BootstrapOptions& options);

// "rank 3 (host-b)", for messages.
std::string RankName(const Welcome& welcome, int rank);

}  // namespace muster::allreduce

#endif  // MUSTER_ALLREDUCE_BOOTSTRAP_H_
