#include "agent/numa.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace muster {
namespace {

constexpr absl::string_view kNvidiaVendor = "0x10de";

std::optional<int> ToInt(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  int value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

// A sysfs file's text without its trailing newline; nullopt when unreadable.
std::optional<std::string> ReadText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(text.str()));
}

struct Gpu {
  std::string address;  // PCI, e.g. 0000:3b:00.0
  int node = 0;
};

// NVIDIA's display and 3D controllers, in PCI bus order: CUDA's order with
// CUDA_DEVICE_ORDER=PCI_BUS_ID, and nvidia-smi's.
std::vector<Gpu> ListGpus(const std::string& sysfs) {
  std::vector<Gpu> gpus;
  const std::string devices = sysfs + "/bus/pci/devices";
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(devices, error)) {
    const std::string dir = entry.path().string();
    const std::optional<std::string> vendor = ReadText(dir + "/vendor");
    const std::optional<std::string> pci_class = ReadText(dir + "/class");
    if (vendor != kNvidiaVendor || !pci_class ||
        !(absl::StartsWith(*pci_class, "0x0300") || absl::StartsWith(*pci_class, "0x0302"))) {
      continue;
    }
    const std::optional<int> node = ToInt(ReadText(dir + "/numa_node").value_or("-1"));
    gpus.push_back(Gpu{entry.path().filename().string(), std::max(node.value_or(-1), 0)});
  }
  std::sort(gpus.begin(), gpus.end(),
            [](const Gpu& a, const Gpu& b) { return a.address < b.address; });
  return gpus;
}

// The host's topology, read once: each node's CPUs (the agent's only).
class Topology {
 public:
  Topology(std::string sysfs, const std::set<int>& allowed) : sysfs_(std::move(sysfs)) {
    std::error_code error;
    for (const auto& entry :
         std::filesystem::directory_iterator(sysfs_ + "/devices/system/node", error)) {
      const std::string name = entry.path().filename().string();
      if (!absl::StartsWith(name, "node")) continue;
      const std::optional<int> node = ToInt(absl::string_view(name).substr(4));
      if (!node) continue;
      std::set<int> cpus;
      const std::set<int> listed =
          ParseCpuList(ReadText(entry.path().string() + "/cpulist").value_or(""))
              .value_or(std::set<int>());
      if (!listed.empty()) ++nodes_with_cpus_;
      for (int cpu : listed) {
        if (allowed.contains(cpu)) cpus.insert(cpu);
      }
      if (!cpus.empty()) node_cpus_[*node] = std::move(cpus);
    }
  }

  // Nodes with at least one of the agent's CPUs.
  const std::map<int, std::set<int>>& node_cpus() const { return node_cpus_; }
  // Nodes with CPUs, the agent's or not.
  int nodes_with_cpus() const { return nodes_with_cpus_; }
  std::set<int> CpusOf(int node) const {
    auto it = node_cpus_.find(node);
    return it == node_cpus_.end() ? std::set<int>() : it->second;
  }
  std::optional<int> Package(int cpu) const {
    return ToInt(ReadText(CpuDir(cpu) + "/topology/physical_package_id").value_or(""));
  }
  // The lowest CPU of `cpu`'s physical core.
  std::optional<int> Core(int cpu) const {
    std::optional<std::set<int>> siblings =
        ParseCpuList(ReadText(CpuDir(cpu) + "/topology/thread_siblings_list").value_or(""));
    if (!siblings || siblings->empty()) return std::nullopt;
    return *siblings->begin();
  }
  // The lowest CPU sharing `cpu`'s last-level cache (its highest unified or data cache).
  std::optional<int> LastLevelCache(int cpu) const {
    int best_level = -1;
    std::optional<int> key;
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(CpuDir(cpu) + "/cache", error)) {
      if (!absl::StartsWith(entry.path().filename().string(), "index")) continue;
      const std::string dir = entry.path().string();
      const std::optional<std::string> type = ReadText(dir + "/type");
      const std::optional<int> level = ToInt(ReadText(dir + "/level").value_or(""));
      if (!type || !level || (*type != "Unified" && *type != "Data") || *level <= best_level) {
        continue;
      }
      std::optional<std::set<int>> shared =
          ParseCpuList(ReadText(dir + "/shared_cpu_list").value_or(""));
      if (!shared || shared->empty()) continue;
      best_level = *level;
      key = *shared->begin();
    }
    return key;
  }

 private:
  std::string CpuDir(int cpu) const { return absl::StrCat(sysfs_, "/devices/system/cpu/cpu", cpu); }

  std::string sysfs_;
  std::map<int, std::set<int>> node_cpus_;
  int nodes_with_cpus_ = 0;
};

NumaPlan Unbound(std::string reason) { return NumaPlan{{}, std::move(reason)}; }

// Groups `cpus` by key (a CPU's core or cache), groups in the order of their keys.
template <typename KeyOf>
std::optional<std::vector<std::vector<int>>> GroupBy(const std::set<int>& cpus, KeyOf key_of) {
  std::map<int, std::vector<int>> groups;
  for (int cpu : cpus) {
    std::optional<int> key = key_of(cpu);
    if (!key) return std::nullopt;
    groups[*key].push_back(cpu);
  }
  std::vector<std::vector<int>> out;
  for (auto& [key, group] : groups) out.push_back(std::move(group));
  return out;
}

}  // namespace

absl::string_view NumaBindingName(NumaBinding binding) {
  switch (binding) {
    case NumaBinding::kNone: return "none";
    case NumaBinding::kNode: return "node";
    case NumaBinding::kSocket: return "socket";
    case NumaBinding::kExclusive: return "exclusive";
    case NumaBinding::kCoreComplex: return "core-complex";
  }
  return "none";
}

std::optional<std::set<int>> ParseCpuList(absl::string_view text) {
  std::set<int> cpus;
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return cpus;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> ends = absl::StrSplit(item, absl::MaxSplits('-', 1));
    std::optional<int> first = ToInt(ends[0]);
    std::optional<int> last = ends.size() == 2 ? ToInt(ends[1]) : first;
    // A bound on the range: a list from a broken file must not take the memory.
    if (!first || !last || *first < 0 || *last < *first || *last >= 1 << 16) return std::nullopt;
    for (int cpu = *first; cpu <= *last; ++cpu) cpus.insert(cpu);
  }
  return cpus;
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::vector<std::string> ranges;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    ranges.push_back(j == i ? absl::StrCat(cpus[i]) : absl::StrCat(cpus[i], "-", cpus[j]));
    i = j + 1;
  }
  return absl::StrJoin(ranges, ",");
}

namespace {

// The CUDA devices the workers see, in CUDA's order, as indexes into
// `gpus`; `unbound` says why there is no binding instead.
struct VisibleGpus {
  std::vector<int> devices;
  std::string unbound;
};

VisibleGpus ListVisible(const std::vector<Gpu>& gpus,
                        const std::optional<std::string>& visible_devices) {
  VisibleGpus out;
  if (!visible_devices) {
    for (int i = 0; i < static_cast<int>(gpus.size()); ++i) out.devices.push_back(i);
    return out;
  }
  for (absl::string_view item : absl::StrSplit(*visible_devices, ',')) {
    std::optional<int> index = ToInt(item);
    if (!index || *index < 0 || *index >= static_cast<int>(gpus.size())) {
      out.unbound = absl::StrCat("CUDA_VISIBLE_DEVICES=", *visible_devices,
                                 " names a device other than by its index among the ", gpus.size(),
                                 " GPUs sysfs shows (a UUID or MIG instance?)");
      return out;
    }
    out.devices.push_back(*index);
  }
  return out;
}

// The CPUs and memory nodes of a rank whose GPU is on NUMA node `node`,
// the `index_on_node`th of `peers` workers' GPUs there; or why none.
std::optional<std::string> BindRank(NumaBinding binding, const Topology& topology, int node,
                                    const std::set<int>& node_cpus, int peers, int index_on_node,
                                    CpuBinding* out) {
  CpuBinding& bound = *out;
  std::set<int> memory_nodes = {node};
  switch (binding) {
    case NumaBinding::kNone: break;
    case NumaBinding::kNode: bound.cpus.assign(node_cpus.begin(), node_cpus.end()); break;
    case NumaBinding::kSocket: {
      const std::optional<int> socket = topology.Package(*node_cpus.begin());
      if (!socket) return std::string("sysfs shows no physical_package_id for the CPUs");
      std::set<int> cpus;
      for (const auto& [other, other_cpus] : topology.node_cpus()) {
        if (topology.Package(*other_cpus.begin()) != socket) continue;
        cpus.insert(other_cpus.begin(), other_cpus.end());
        memory_nodes.insert(other);
      }
      bound.cpus.assign(cpus.begin(), cpus.end());
      break;
    }
    case NumaBinding::kExclusive: {
      auto cores = GroupBy(node_cpus, [&](int cpu) { return topology.Core(cpu); });
      if (!cores) return std::string("sysfs shows no thread_siblings_list for the CPUs");
      const int count = static_cast<int>(cores->size());
      if (count < peers) {
        return std::string(absl::StrCat("NUMA node ", node, " has ", count,
                                        " physical core(s) of this agent's for ", peers,
                                        " GPUs: none left to give each its own"));
      }
      const int share = count / peers, extra = count % peers;
      const int first = index_on_node * share + std::min(index_on_node, extra);
      const int taken = share + (index_on_node < extra ? 1 : 0);
      for (int core = first; core < first + taken; ++core) {
        bound.cpus.insert(bound.cpus.end(), (*cores)[core].begin(), (*cores)[core].end());
      }
      std::sort(bound.cpus.begin(), bound.cpus.end());
      break;
    }
    case NumaBinding::kCoreComplex: {
      auto complexes = GroupBy(node_cpus, [&](int cpu) { return topology.LastLevelCache(cpu); });
      if (!complexes || complexes->empty()) {
        return std::string("sysfs shows no cache topology (cpu*/cache/index*) for the CPUs");
      }
      // Largest first; equal sizes in the order of their first CPU (stable).
      std::stable_sort(complexes->begin(), complexes->end(),
                       [](const auto& a, const auto& b) { return a.size() > b.size(); });
      bound.cpus = (*complexes)[index_on_node % complexes->size()];
      break;
    }
  }
  bound.memory_nodes.assign(memory_nodes.begin(), memory_nodes.end());
  return std::nullopt;
}

}  // namespace

absl::StatusOr<NumaPlan> PlanNumaBinding(NumaBinding binding, const std::string& sysfs,
                                         const std::set<int>& allowed_cpus,
                                         const std::optional<std::string>& visible_devices,
                                         int nproc) {
  if (binding == NumaBinding::kNone) return Unbound("no binding asked for");
  const std::vector<Gpu> gpus = ListGpus(sysfs);
  if (gpus.empty()) return Unbound(absl::StrCat("no NVIDIA GPU in ", sysfs, "/bus/pci/devices"));
  const VisibleGpus visible = ListVisible(gpus, visible_devices);
  if (!visible.unbound.empty()) return Unbound(visible.unbound);
  const std::vector<int>& devices = visible.devices;
  if (nproc > static_cast<int>(devices.size())) {
    return Unbound(absl::StrCat(nproc, " workers for ", devices.size(),
                                " GPU(s): a worker would have no GPU to be near"));
  }
  const Topology topology(sysfs, allowed_cpus);
  if (topology.node_cpus().empty()) {
    return Unbound(
        absl::StrCat("no NUMA node with this agent's CPUs in ", sysfs, "/devices/system/node"));
  }
  if (topology.nodes_with_cpus() == 1 &&
      (binding == NumaBinding::kNode || binding == NumaBinding::kSocket)) {
    return Unbound("this host has one NUMA node: every worker would be bound to every CPU");
  }

  NumaPlan plan;
  for (int rank = 0; rank < nproc; ++rank) {
    const int node = gpus[devices[rank]].node;
    const std::set<int> node_cpus = topology.CpusOf(node);
    if (node_cpus.empty()) {
      return Unbound(absl::StrCat("GPU ", gpus[devices[rank]].address, " is on NUMA node ", node,
                                  ", which has none of this agent's CPUs"));
    }
    // The workers' GPUs on this node, in device order: which share is this one's.
    int peers = 0, index_on_node = 0;
    for (int d = 0; d < static_cast<int>(devices.size()); ++d) {
      if (gpus[devices[d]].node != node) continue;
      if (d == rank) index_on_node = peers;
      ++peers;
    }
    CpuBinding bound;
    if (std::optional<std::string> unbound =
            BindRank(binding, topology, node, node_cpus, peers, index_on_node, &bound)) {
      return Unbound(*std::move(unbound));
    }
    plan.per_rank.push_back(std::move(bound));
  }
  return plan;
}

}  // namespace muster
