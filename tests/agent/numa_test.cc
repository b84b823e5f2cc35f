#include "agent/numa.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace muster {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A sysfs tree of a host that is not this one, in a temporary directory.
class FakeSysfs {
 public:
  const std::string& root() const { return root_; }

  void Gpu(const std::string& address, int node, const std::string& pci_class = "0x030200") {
    const std::string dir = absl::StrCat("/bus/pci/devices/", address);
    Write(dir + "/vendor", "0x10de");
    Write(dir + "/class", pci_class);
    Write(dir + "/numa_node", absl::StrCat(node));
  }
  void OtherDevice(const std::string& address) {
    Write(absl::StrCat("/bus/pci/devices/", address, "/vendor"), "0x8086");
    Write(absl::StrCat("/bus/pci/devices/", address, "/class"), "0x020000");
  }
  // Node `node` with CPUs first..first+count-1, in cores of two threads on
  // `package`, each core's L3 shared by `l3` CPUs (0: no cache files).
  void Node(int node, int first, int count, int package, int l3 = 0) {
    Write(absl::StrCat("/devices/system/node/node", node, "/cpulist"),
          absl::StrCat(first, "-", first + count - 1));
    for (int cpu = first; cpu < first + count; ++cpu) {
      const std::string dir = absl::StrCat("/devices/system/cpu/cpu", cpu);
      const int core = cpu - (cpu - first) % 2;
      Write(dir + "/topology/physical_package_id", absl::StrCat(package));
      Write(dir + "/topology/thread_siblings_list", absl::StrCat(core, "-", core + 1));
      if (l3 == 0) continue;
      Write(dir + "/cache/index0/level", "1");
      Write(dir + "/cache/index0/type", "Data");
      Write(dir + "/cache/index0/shared_cpu_list", absl::StrCat(core, "-", core + 1));
      Write(dir + "/cache/index1/level", "1");
      Write(dir + "/cache/index1/type", "Instruction");
      Write(dir + "/cache/index1/shared_cpu_list", absl::StrCat(core, "-", core + 1));
      const int l3_first = cpu - (cpu - first) % l3;
      Write(dir + "/cache/index3/level", "3");
      Write(dir + "/cache/index3/type", "Unified");
      Write(dir + "/cache/index3/shared_cpu_list", absl::StrCat(l3_first, "-", l3_first + l3 - 1));
    }
  }

 private:
  void Write(const std::string& path, const std::string& text) {
    const std::filesystem::path full = root_ + path;
    std::filesystem::create_directories(full.parent_path());
    std::ofstream(full) << text << "\n";
  }
  support::TempDir temp_{"numa_test"};
  const std::string root_ = temp_.path();
};

std::set<int> Cpus(int first, int count) {
  std::set<int> cpus;
  for (int cpu = first; cpu < first + count; ++cpu) cpus.insert(cpu);
  return cpus;
}

std::vector<int> Range(int first, int count) {
  std::vector<int> cpus;
  for (int cpu = first; cpu < first + count; ++cpu) cpus.push_back(cpu);
  return cpus;
}

// 2 sockets of 2 NUMA nodes, 8 CPUs (4 cores) each; 8 GPUs, two per node;
// one L3 cache per node. The PCI order is not the order they are listed in.
class TwoSocketHost : public ::testing::Test {
 protected:
  TwoSocketHost() {
    for (int node = 0; node < 4; ++node) sysfs_.Node(node, 8 * node, 8, node / 2, 8);
    for (int gpu = 7; gpu >= 0; --gpu)
      sysfs_.Gpu(absl::StrCat("0000:", 10 + gpu, ":00.0"), gpu / 2);
    sysfs_.OtherDevice("0000:00:1f.0");
  }
  NumaPlan Plan(NumaBinding binding, int nproc, std::optional<std::string> visible = std::nullopt,
                const std::set<int>& allowed = Cpus(0, 32)) {
    absl::StatusOr<NumaPlan> plan =
        PlanNumaBinding(binding, sysfs_.root(), allowed, visible, nproc);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? *plan : NumaPlan{};
  }
  FakeSysfs sysfs_;
};

TEST_F(TwoSocketHost, NodeBindsEachWorkerToItsGpusNode) {
  NumaPlan plan = Plan(NumaBinding::kNode, 8);
  ASSERT_EQ(plan.per_rank.size(), 8u) << plan.unbound_reason;
  for (int rank = 0; rank < 8; ++rank) {
    EXPECT_EQ(plan.per_rank[rank].cpus, Range(8 * (rank / 2), 8)) << rank;
    EXPECT_THAT(plan.per_rank[rank].memory_nodes, ElementsAre(rank / 2)) << rank;
  }
}

TEST_F(TwoSocketHost, OnlyTheAgentsCpusAreGiven) {
  std::set<int> allowed = Cpus(0, 32);
  allowed.erase(3);
  NumaPlan plan = Plan(NumaBinding::kNode, 1, std::nullopt, allowed);
  ASSERT_EQ(plan.per_rank.size(), 1u);
  EXPECT_THAT(plan.per_rank[0].cpus, ElementsAre(0, 1, 2, 4, 5, 6, 7));
}

TEST_F(TwoSocketHost, SocketBindsEveryNodeOfTheGpusSocket) {
  NumaPlan plan = Plan(NumaBinding::kSocket, 8);
  ASSERT_EQ(plan.per_rank.size(), 8u) << plan.unbound_reason;
  EXPECT_EQ(plan.per_rank[0].cpus, Range(0, 16));
  EXPECT_THAT(plan.per_rank[0].memory_nodes, ElementsAre(0, 1));
  EXPECT_EQ(plan.per_rank[5].cpus, Range(16, 16));
  EXPECT_THAT(plan.per_rank[5].memory_nodes, ElementsAre(2, 3));
}

TEST_F(TwoSocketHost, ExclusiveSplitsTheNodesCoresAmongItsGpus) {
  NumaPlan plan = Plan(NumaBinding::kExclusive, 8);
  ASSERT_EQ(plan.per_rank.size(), 8u) << plan.unbound_reason;
  EXPECT_EQ(plan.per_rank[0].cpus, Range(0, 4));  // cores 0 and 2, with their siblings
  EXPECT_EQ(plan.per_rank[1].cpus, Range(4, 4));
  EXPECT_EQ(plan.per_rank[7].cpus, Range(28, 4));
  EXPECT_THAT(plan.per_rank[7].memory_nodes, ElementsAre(3));
  // No CPU is given twice.
  std::set<int> seen;
  for (const CpuBinding& bound : plan.per_rank) {
    for (int cpu : bound.cpus) EXPECT_TRUE(seen.insert(cpu).second) << cpu;
  }
}

// Three cores for two GPUs: the first takes the one left over.
TEST_F(TwoSocketHost, ExclusiveGivesTheFirstGpusOneCoreMoreWhenTheyDoNotDivide) {
  std::set<int> allowed = Cpus(0, 32);
  allowed.erase(6);
  allowed.erase(7);
  NumaPlan plan = Plan(NumaBinding::kExclusive, 2, std::nullopt, allowed);
  ASSERT_EQ(plan.per_rank.size(), 2u) << plan.unbound_reason;
  EXPECT_EQ(plan.per_rank[0].cpus, Range(0, 4));
  EXPECT_EQ(plan.per_rank[1].cpus, Range(4, 2));
}

// CUDA_VISIBLE_DEVICES: the workers' devices, and the only GPUs that share a node.
TEST_F(TwoSocketHost, VisibleDevicesPickTheGpus) {
  NumaPlan plan = Plan(NumaBinding::kExclusive, 3, "6,0,1");
  ASSERT_EQ(plan.per_rank.size(), 3u) << plan.unbound_reason;
  EXPECT_EQ(plan.per_rank[0].cpus, Range(24, 8));  // GPU 6 is alone on node 3 here
  EXPECT_EQ(plan.per_rank[1].cpus, Range(0, 4));
  EXPECT_EQ(plan.per_rank[2].cpus, Range(4, 4));
}

TEST_F(TwoSocketHost, CoreComplexWithOneCachePerNodeIsTheNode) {
  NumaPlan plan = Plan(NumaBinding::kCoreComplex, 2);
  ASSERT_EQ(plan.per_rank.size(), 2u) << plan.unbound_reason;
  EXPECT_EQ(plan.per_rank[0].cpus, Range(0, 8));
  EXPECT_EQ(plan.per_rank[1].cpus, Range(0, 8));
}

TEST_F(TwoSocketHost, WhyAWorkerGetsNoBinding) {
  EXPECT_THAT(Plan(NumaBinding::kNode, 9).unbound_reason, HasSubstr("9 workers for 8 GPU(s)"));
  EXPECT_THAT(Plan(NumaBinding::kNode, 2, "0").unbound_reason, HasSubstr("2 workers for 1 GPU(s)"));
  EXPECT_THAT(Plan(NumaBinding::kNode, 1, "GPU-8f1c2b3a").unbound_reason,
              HasSubstr("a UUID or MIG instance"));
  EXPECT_THAT(Plan(NumaBinding::kNode, 1, "8").unbound_reason, HasSubstr("among the 8 GPUs"));
  // Two GPUs on a node with one core of the agent's.
  EXPECT_THAT(Plan(NumaBinding::kExclusive, 2, std::nullopt, {0, 1}).unbound_reason,
              HasSubstr("NUMA node 0 has 1 physical core(s) of this agent's for 2 GPUs"));
  EXPECT_THAT(Plan(NumaBinding::kNode, 1, std::nullopt, {8, 9}).unbound_reason,
              HasSubstr("none of this agent's CPUs"));
}

// 2 sockets, one NUMA node each of 16 CPUs, whose L3 caches serve 8 CPUs
// each (AMD's core complexes); 4 GPUs per node.
class CoreComplexHost : public ::testing::Test {
 protected:
  CoreComplexHost() {
    for (int node = 0; node < 2; ++node) sysfs_.Node(node, 16 * node, 16, node, 8);
    for (int gpu = 0; gpu < 8; ++gpu) sysfs_.Gpu(absl::StrCat("0000:", 20 + gpu, ":00.0"), gpu / 4);
  }
  FakeSysfs sysfs_;
};

TEST_F(CoreComplexHost, TheNodesGpusTakeItsCacheDomainsInTurn) {
  absl::StatusOr<NumaPlan> plan =
      PlanNumaBinding(NumaBinding::kCoreComplex, sysfs_.root(), Cpus(0, 32), std::nullopt, 8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->per_rank.size(), 8u) << plan->unbound_reason;
  EXPECT_EQ(plan->per_rank[0].cpus, Range(0, 8));
  EXPECT_EQ(plan->per_rank[1].cpus, Range(8, 8));
  EXPECT_EQ(plan->per_rank[2].cpus, Range(0, 8));
  EXPECT_EQ(plan->per_rank[4].cpus, Range(16, 8));
  EXPECT_EQ(plan->per_rank[7].cpus, Range(24, 8));
  EXPECT_THAT(plan->per_rank[7].memory_nodes, ElementsAre(1));
}

TEST_F(CoreComplexHost, TheLargestCacheDomainComesFirst) {
  std::set<int> allowed = Cpus(0, 32);
  allowed.erase(0);
  allowed.erase(1);
  absl::StatusOr<NumaPlan> plan =
      PlanNumaBinding(NumaBinding::kCoreComplex, sysfs_.root(), allowed, std::nullopt, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->per_rank.size(), 2u) << plan->unbound_reason;
  EXPECT_EQ(plan->per_rank[0].cpus, Range(8, 8));
  EXPECT_EQ(plan->per_rank[1].cpus, Range(2, 6));
}

TEST_F(CoreComplexHost, SocketIsTheNodeWhenEachSocketHasOne) {
  absl::StatusOr<NumaPlan> plan =
      PlanNumaBinding(NumaBinding::kSocket, sysfs_.root(), Cpus(0, 32), std::nullopt, 8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->per_rank.size(), 8u);
  EXPECT_EQ(plan->per_rank[5].cpus, Range(16, 16));
}

TEST(NumaPlanTest, NoGpuMeansNoBinding) {
  FakeSysfs sysfs;
  sysfs.Node(0, 0, 4, 0);
  sysfs.Node(1, 4, 4, 1);
  sysfs.OtherDevice("0000:00:02.0");
  absl::StatusOr<NumaPlan> plan =
      PlanNumaBinding(NumaBinding::kNode, sysfs.root(), Cpus(0, 8), std::nullopt, 1);
  ASSERT_TRUE(plan.ok());
  EXPECT_THAT(plan->per_rank, IsEmpty());
  EXPECT_THAT(plan->unbound_reason, HasSubstr("no NVIDIA GPU"));
}

// A host without NUMA says -1: node 0. One node: node and socket would be
// every CPU, so none; exclusive still splits the cores.
TEST(NumaPlanTest, OneNumaNode) {
  FakeSysfs sysfs;
  sysfs.Node(0, 0, 8, 0);
  sysfs.Gpu("0000:01:00.0", -1);
  sysfs.Gpu("0000:02:00.0", -1, "0x030000");
  for (NumaBinding binding : {NumaBinding::kNode, NumaBinding::kSocket}) {
    absl::StatusOr<NumaPlan> plan =
        PlanNumaBinding(binding, sysfs.root(), Cpus(0, 8), std::nullopt, 2);
    ASSERT_TRUE(plan.ok());
    EXPECT_THAT(plan->unbound_reason, HasSubstr("one NUMA node"));
  }
  absl::StatusOr<NumaPlan> exclusive =
      PlanNumaBinding(NumaBinding::kExclusive, sysfs.root(), Cpus(0, 8), std::nullopt, 2);
  ASSERT_TRUE(exclusive.ok());
  ASSERT_EQ(exclusive->per_rank.size(), 2u) << exclusive->unbound_reason;
  EXPECT_EQ(exclusive->per_rank[1].cpus, Range(4, 4));
  absl::StatusOr<NumaPlan> complex =
      PlanNumaBinding(NumaBinding::kCoreComplex, sysfs.root(), Cpus(0, 8), std::nullopt, 2);
  ASSERT_TRUE(complex.ok());
  EXPECT_THAT(complex->unbound_reason, HasSubstr("no cache topology"));
}

TEST(CpuListTest, ParseAndFormat) {
  EXPECT_EQ(ParseCpuList("0-3,8,10-11\n"), (std::set<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(ParseCpuList(""), std::set<int>());
  for (const char* bad : {"a", "3-1", "1,,2", "-1", "0-99999999"}) {
    EXPECT_FALSE(ParseCpuList(bad).has_value()) << bad;
  }
  EXPECT_EQ(FormatCpuList({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(FormatCpuList({}), "");
}

}  // namespace
}  // namespace muster
