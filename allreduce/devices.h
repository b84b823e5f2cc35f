// Who runs where: each rank's host and GPU, as the bootstrap collects them,
// and the check that no two ranks share a GPU.
#ifndef MUSTER_ALLREDUCE_DEVICES_H_
#define MUSTER_ALLREDUCE_DEVICES_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace muster::allreduce {

struct RankIdentity {
  int rank = 0;
  std::string host;
  std::string bus_id;  // the GPU's PCI bus id; empty without a GPU
};

// kInvalidArgument when two ranks on one host drive the same GPU (the
// classic "only GPU 0 is working": every rank on cuda:0), naming both
// ranks, the host and the bus id. Ranks without a GPU are not compared.
absl::Status CheckDistinctDevices(const std::vector<RankIdentity>& ranks);

}  // namespace muster::allreduce

#endif  // MUSTER_ALLREDUCE_DEVICES_H_
