#include "launcher/slurm.h"

#include <cstdint>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/endpoint.h"
#include "common/hostlist.h"
#include "launcher/nproc.h"

namespace muster {
namespace {

absl::Status Inconsistent(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "the Slurm environment is inconsistent: ", what,
      "; run muster through srun or sbatch in an allocation, or give --nnodes, --node-rank and "
      "--rdzv-endpoint yourself"));
}

absl::StatusOr<int> ReadCount(const std::function<std::optional<std::string>(const char*)>& get,
                              const char* name) {
  const std::optional<std::string> value = get(name);
  int parsed = 0;
  if (!value || !absl::SimpleAtoi(*value, &parsed) || parsed < 0) {
    return Inconsistent(absl::StrCat(name, "=", value.value_or("(unset)"), " is not a count"));
  }
  return parsed;
}

// "4", "gpu:4", "a100:4", "gpu:a100:4" -> 4.
std::optional<int> GpuCount(absl::string_view spec) {
  const size_t colon = spec.rfind(':');
  int count = 0;
  if (!absl::SimpleAtoi(colon == absl::string_view::npos ? spec : spec.substr(colon + 1), &count) ||
      count < 0) {
    return std::nullopt;
  }
  return count;
}

}  // namespace

int SlurmRendezvousPort(const std::string& job_id) {
  uint64_t id = 0;
  if (!absl::SimpleAtoi(job_id, &id)) {
    for (char c : job_id) id = id * 31 + static_cast<unsigned char>(c);  // array jobs: "123_4"
  }
  return 20000 + static_cast<int>(id % 10000);
}

std::string SlurmJob::Describe() const {
  return absl::StrCat("muster: in Slurm job ", job_id, " (SLURM_JOB_ID): ", nnodes,
                      " node(s) (SLURM_NNODES), this is node ", node_id,
                      " (SLURM_NODEID); rendezvous on ", FormatEndpoint(rendezvous_host(), port),
                      " (first host of ", hostlist_variable, ", port from the job id); ", nproc,
                      " worker(s) per node (", nproc_from, "). Flags given override these.");
}

absl::StatusOr<std::optional<SlurmJob>> DetectSlurm(
    const std::function<std::optional<std::string>(const char*)>& get) {
  const std::optional<std::string> job_id = get("SLURM_JOB_ID");
  if (!job_id || job_id->empty()) return std::nullopt;
  SlurmJob job;
  job.job_id = *job_id;
  job.port = SlurmRendezvousPort(job.job_id);

  absl::StatusOr<int> nnodes = ReadCount(get, "SLURM_NNODES");
  if (!nnodes.ok()) return nnodes.status();
  // salloc's shell has no SLURM_NODEID: on one node, it can only be node 0.
  absl::StatusOr<int> node_id = !get("SLURM_NODEID") && *nnodes == 1
                                    ? absl::StatusOr<int>(0)
                                    : ReadCount(get, "SLURM_NODEID");
  if (!node_id.ok()) return node_id.status();
  job.nnodes = *nnodes;
  job.node_id = *node_id;
  if (job.nnodes < 1) return Inconsistent("SLURM_NNODES=0");

  job.hostlist_variable = get("SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST" : "SLURM_NODELIST";
  const std::optional<std::string> list = get(job.hostlist_variable.c_str());
  if (!list) return Inconsistent("neither SLURM_JOB_NODELIST nor SLURM_NODELIST is set");
  absl::StatusOr<std::vector<std::string>> hosts = ExpandHostlist(*list);
  if (!hosts.ok()) {
    return Inconsistent(absl::StrCat(job.hostlist_variable, ": ", hosts.status().message()));
  }
  job.hosts = *std::move(hosts);
  if (static_cast<int>(job.hosts.size()) != job.nnodes) {
    return Inconsistent(absl::StrCat("SLURM_NNODES=", job.nnodes, " but ", job.hostlist_variable,
                                     "=", *list, " names ", job.hosts.size(), " host(s)"));
  }
  if (job.node_id >= job.nnodes) {
    return Inconsistent(absl::StrCat("SLURM_NODEID=", job.node_id, " but SLURM_NNODES=", job.nnodes,
                                     " (node ids go from 0 to ", job.nnodes - 1, ")"));
  }

  // One agent per node: a step with several tasks per node would start
  // several agents, each launching every worker of the node.
  if (const std::optional<std::string> tasks = get("SLURM_NTASKS_PER_NODE")) {
    int per_node = 0;
    if (absl::SimpleAtoi(*tasks, &per_node) && per_node > 1) {
      return Inconsistent(
          absl::StrCat("SLURM_NTASKS_PER_NODE=", *tasks,
                       ": muster is one agent per node and starts the node's workers itself; use "
                       "--ntasks-per-node=1 and --nproc-per-node (or let muster count the GPUs)"));
    }
  }
  if (const std::optional<std::string> tasks = get("SLURM_STEP_TASKS_PER_NODE")) {
    // "1(x2)" is one task on each of 2 nodes; "2(x2)" or "2,1" has nodes with two.
    for (absl::string_view part : absl::StrSplit(*tasks, ',')) {
      int count = 0;
      if (absl::SimpleAtoi(part.substr(0, part.find('(')), &count) && count > 1) {
        return Inconsistent(absl::StrCat(
            "SLURM_STEP_TASKS_PER_NODE=", *tasks,
            ": srun started more than one muster on a node; use srun --ntasks-per-node=1"));
      }
    }
  }

  // Workers per node: the GPUs Slurm gave this node.
  for (const char* name : {"SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"}) {
    const std::optional<std::string> spec = get(name);
    if (!spec || spec->empty()) continue;
    const std::optional<int> count = GpuCount(*spec);
    if (!count) return Inconsistent(absl::StrCat(name, "=", *spec, " is not a GPU count"));
    if (*count > 0) {
      job.nproc = *count;
      job.nproc_from = absl::StrCat(name, "=", *spec);
      return job;
    }
  }
  if (const std::optional<std::string> visible = get("CUDA_VISIBLE_DEVICES");
      visible && CountVisibleGpus(visible) > 0) {
    job.nproc = CountVisibleGpus(visible);
    job.nproc_from = absl::StrCat("CUDA_VISIBLE_DEVICES=", *visible);
    return job;
  }
  job.nproc = 1;
  job.nproc_from = "no GPUs allocated: 1";
  return job;
}

}  // namespace muster
