// --numa-binding (torchrun 2.9): which CPUs, and which NUMA nodes' memory,
// each worker is bound to, from the host's topology as sysfs tells it.
// Pure apart from reading files under a root directory, so the tests give
// it fake sysfs trees; the binding itself is applied in the child between
// clone and exec (SpawnOptions::cpus, ::memory_nodes).
//
// The rules, as torch/numa/binding.py has them (PyTorch main, 2026). A
// worker's GPU is the CUDA device of its local rank: the N-th NVIDIA GPU in
// PCI bus order, or the N-th entry of CUDA_VISIBLE_DEVICES. Its NUMA node is
// the PCI device's numa_node (-1, a host without NUMA, is node 0). A node's
// CPUs are its cpulist less those the agent may not run on.
//   node          the CPUs of the GPU's node
//   socket        the CPUs of every node whose first CPU is on the socket
//                 (physical_package_id) of the node's first CPU
//   exclusive     the node's physical cores (thread siblings kept together)
//                 split in order among the node's GPUs, the first ones
//                 taking one more when they do not divide evenly
//   core-complex  the CPUs of the node that share one last-level cache
//                 (the highest unified or data cache), the GPUs of the node
//                 taking the largest of those groups in turn
// Memory: the NUMA nodes of the chosen CPUs, preferred (torch binds CPUs
// only; a preference keeps pinned and host buffers near the GPU without
// failing an allocation when the node is full).
#ifndef MUSTER_AGENT_NUMA_H_
#define MUSTER_AGENT_NUMA_H_

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/config.h"

namespace muster {

// "node", "socket", "exclusive", "core-complex" (as the option spells them); "none".
absl::string_view NumaBindingName(NumaBinding binding);

struct CpuBinding {
  std::vector<int> cpus;          // sorted
  std::vector<int> memory_nodes;  // sorted
};

// Each worker's binding, or why there is none.
struct NumaPlan {
  std::vector<CpuBinding> per_rank;  // one per local rank; empty when unbound
  std::string unbound_reason;        // set when per_rank is empty
};

// The plan for `nproc` local ranks under `binding` (not kNone). `sysfs`:
// where sysfs is ("/sys" on a host). `allowed_cpus`: the CPUs the agent may
// run on (sched_getaffinity). `visible_devices`: CUDA_VISIBLE_DEVICES, when
// set. A host with no NVIDIA GPU, with only one NUMA node (for node and
// socket, whose binding would then be every CPU), with more workers than
// GPUs, or without the topology a mode needs, gets no binding and the
// reason; an unreadable sysfs is an error.
absl::StatusOr<NumaPlan> PlanNumaBinding(NumaBinding binding, const std::string& sysfs,
                                         const std::set<int>& allowed_cpus,
                                         const std::optional<std::string>& visible_devices,
                                         int nproc);

// A kernel CPU list ("0-3,8,10-11") as numbers; nullopt when malformed.
std::optional<std::set<int>> ParseCpuList(absl::string_view text);
// The other way: sorted numbers as a CPU list, ranges joined.
std::string FormatCpuList(const std::vector<int>& cpus);

}  // namespace muster

#endif  // MUSTER_AGENT_NUMA_H_
