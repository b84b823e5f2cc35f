#include "allreduce/gather.h"

#include "absl/strings/str_cat.h"
#include "allreduce/devices.h"

namespace muster::allreduce {

std::string JobName(const std::string& job) { return job.empty() ? "a job with no id" : job; }

HelloCheck CheckHello(const Hello& root, const Hello& hello, const std::vector<bool>& arrived,
                      absl::string_view root_endpoint) {
  const int world_size = root.world_size();
  if (hello.job() != root.job()) {
    return {HelloVerdict::kTurnAway,
            absl::InvalidArgumentError(absl::StrCat(
                "rank 0 at ", root_endpoint, " belongs to ", JobName(root.job()), ", not to ",
                hello.job().empty() ? "this rank's job, which has no id" : hello.job(),
                "; give each job its own MASTER_PORT"))};
  }
  const bool in_range = hello.rank() > 0 && hello.rank() < world_size;
  if (hello.world_size() != world_size || !in_range || arrived[hello.rank()]) {
    return {HelloVerdict::kStopJob,
            absl::InvalidArgumentError(
                absl::StrCat("rank 0 (WORLD_SIZE ", world_size, ") cannot take a rank ",
                             hello.rank(), " with WORLD_SIZE ", hello.world_size(),
                             in_range && arrived[hello.rank()] ? " (it has that rank already)" : "",
                             "; every rank needs the same WORLD_SIZE and its own RANK"))};
  }
  if (hello.sweep() != root.sweep()) {
    return {HelloVerdict::kStopJob,
            absl::InvalidArgumentError(absl::StrCat(
                "rank ", hello.rank(), " (", hello.host(), ") runs '", hello.sweep(),
                "' but rank 0 runs '", root.sweep(), "'; give every rank the same options"))};
  }
  return {HelloVerdict::kTake, absl::OkStatus()};
}

absl::StatusOr<Welcome> PlanWelcome(const std::vector<Hello>& hellos,
                                    const std::vector<std::string>& addrs, Backend asked) {
  std::vector<RankIdentity> identities;
  for (const Hello& h : hellos) identities.push_back({h.rank(), h.host(), h.bus_id()});
  if (absl::Status distinct = CheckDistinctDevices(identities); !distinct.ok()) return distinct;
  BackendFacts facts;
  facts.world_size = static_cast<int>(hellos.size());
  const std::string& root_machine = hellos[0].machine();
  for (const Hello& h : hellos) {
    if (!h.can_nccl()) facts.without_nccl.push_back(h.rank());
    if (h.machine().empty() || h.machine() != root_machine) facts.elsewhere.push_back(h.rank());
  }
  absl::StatusOr<Backend> backend = ChooseBackend(asked, facts);
  if (!backend.ok()) return backend.status();
  Welcome welcome;
  welcome.set_backend(BackendName(*backend));
  for (size_t r = 0; r < hellos.size(); ++r) {
    Peer* peer = welcome.add_peers();
    peer->set_rank(static_cast<int>(r));
    peer->set_host(hellos[r].host());
    peer->set_addr(addrs[r]);
    peer->set_ring_port(hellos[r].ring_port());
    peer->set_bus_id(hellos[r].bus_id());
  }
  return welcome;
}

SizeResult OwnRow(const SweepSize& size, DataType type, const LocalResult& local) {
  SizeResult row;
  row.bytes = size.bytes;
  row.count = size.count;
  row.type = type;
  row.time_us = local.time_us;
  row.wrong = local.wrong;
  row.inplace_time_us = local.inplace_time_us;
  row.inplace_wrong = local.inplace_wrong;
  return row;
}

absl::Status AddReport(const SizeReport& report, absl::string_view rank_name, SizeResult& row) {
  if (!report.error().empty()) {
    return absl::UnavailableError(absl::StrCat(rank_name, " failed: ", report.error()));
  }
  row.time_us += report.time_us();
  row.inplace_time_us += report.inplace_time_us();
  row.wrong += report.wrong();
  row.inplace_wrong += report.inplace_wrong();
  return absl::OkStatus();
}

void AverageTimes(int world_size, SizeResult& row) {
  row.time_us /= world_size;
  row.inplace_time_us /= world_size;
}

int64_t WrongValues(const std::vector<SizeResult>& rows) {
  int64_t wrong = 0;
  for (const SizeResult& r : rows) wrong += r.wrong + r.inplace_wrong;
  return wrong;
}

}  // namespace muster::allreduce
