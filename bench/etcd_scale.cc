// etcd_scale: N simulated agents of one job on a 3-member etcd cluster
// (--rdzv-backend etcd, issue 12), in one process.
//
// Each node is what an agent's rendezvous is: a RendezvousClient from
// NewEtcdRendezvousClient (its own worker thread, its own etcd lease, its
// own outbox watch; one node, elected through etcd, also runs the job's
// state machine, EtcdLeader). Job config as agents send it with
// `--rdzv-conf last_call_timeout=0,heartbeat_timeout=30`: min = max = N,
// 8 workers per node. Per run, with a job id of its own:
//   join     every node's Join, sent together: the first sent to the last
//            assignment received; checks group ranks 0..N-1 once each, one
//            round (0), world size 8N, one master.
//   restart  every node opens its Watch (its node secret, known_round 0) and
//            the bench waits for every WatchStarted; node 0 reports a worker
//            failure for round 0; each node that gets RoundChanged joins
//            again with its secret, as an agent does: the report sent to the
//            last new assignment received; checks round 1, restart_count 1,
//            ranks as above.
//   close    every node reports done: until every watch has JobClosed
//            (succeeded). Not a goal of the issue; it leaves etcd clean.
// Each phase also prints what etcd did meanwhile: WAL fsyncs and their mean
// time, raft proposals committed (from the members' /metrics, with curl) and
// the CPU of the members and of this process (/proc, getrusage).
//
// The cluster is tests/etcd/cluster.sh's, started in a fresh directory and
// stopped at the end whatever happens (and by its watchdog if this process
// dies); --endpoints uses one started by hand instead (no etcd CPU then).
//
// By default all nodes share one EtcdClient (--clients 1), as the
// rendezvous of one agent shares its client with the leader it may become:
// one gRPC channel per member, every stream (each node's lease keep-alive,
// outbox watch and leader watch) multiplexed on it. --clients K spreads the
// nodes over K clients, client k starting at member k % 3 (the sockets this
// process holds are printed, to tell what gRPC shares among them). Real
// agents each have their own connection, in a process of their own; here
// each node has its own worker thread (1,000 nodes: 1,000 threads; the
// count is printed).
//
// When a phase leaves nodes unanswered, the bench reads what etcd holds for
// them (their node key, their outbox, the leader key) before their calls
// time out, and prints it. --attempt-timeout-ms shortens the clients'
// attempt timeout, so that calls are repeated on another member as they
// are when etcd is slow to answer; --trace prints the leader's
// transactions to the outboxes in each phase.
//
// Not run in CI: timed goals are printed, not asserted.
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/release_mode.h"
#include "proto/etcd_rendezvous.pb.h"
#include "rendezvous/client/client.h"
#include "rendezvous/etcd/backend.h"
#include "rendezvous/etcd/client.h"
#include "rendezvous/etcd/keys.h"
#include "rendezvous/rules/protocol.h"
#include "tests/support/etcd_test_cluster.h"
#include "tests/support/temp_dir.h"

namespace muster::etcd::scale {
namespace {

using SteadyClock = std::chrono::steady_clock;
using rdzv::Assignment;

constexpr int kLocalWorldSize = 8;
constexpr absl::Duration kHeartbeatTimeout = absl::Seconds(30);
constexpr int kFirstMasterPort = 20000;
// The agents' default join_timeout (torchrun's too): longer than any phase
// here, so a stuck join shows as such rather than as a closed job.
constexpr absl::Duration kJoinTimeout = absl::Seconds(600);

double MsBetween(SteadyClock::time_point start, SteadyClock::time_point end) {
  return std::chrono::duration<double, std::milli>(end - start).count();
}

// What etcd (and this process) did, as counters read at one moment.
struct Counters {
  double fsyncs = 0;         // WAL fsyncs, the member with the most
  double fsync_seconds = 0;  // their time, same member
  double proposals = 0;      // raft proposals committed, the member with the most
  double etcd_cpu_s = 0;     // user + system, every member we started
  double bench_cpu_s = 0;    // this process
  bool metrics = false;      // the members' /metrics could be read
};

// The value of an unlabelled metric in etcd's /metrics text; 0 if absent.
double Metric(const std::string& text, absl::string_view name) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, name) || !absl::ConsumePrefix(&line, " ")) continue;
    double value = 0;
    if (absl::SimpleAtod(line, &value)) return value;
  }
  return 0;
}

double ProcessCpuSeconds(int pid) {
  const std::string text = support::ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields = absl::StrSplit(text.substr(close + 2), ' ');
  // Fields 14 and 15 of stat (utime, stime) are 11 and 12 after the name.
  double utime = 0, stime = 0;
  if (fields.size() < 13 || !absl::SimpleAtod(fields[11], &utime) ||
      !absl::SimpleAtod(fields[12], &stime)) {
    return 0;
  }
  return (utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

Counters ReadCounters(const std::vector<std::string>& endpoints, const std::vector<int>& pids) {
  Counters counters;
  counters.metrics = true;
  for (const std::string& endpoint : endpoints) {
    absl::StatusOr<std::string> text = Shell(
        absl::StrCat("curl -s --max-time 2 http://", endpoint,
                     "/metrics | grep -E \"^etcd_(disk_wal_fsync_duration_seconds_(sum|count)|"
                     "server_proposals_committed_total) \""),
        absl::Seconds(5));
    if (!text.ok()) {
      counters.metrics = false;
      continue;
    }
    const double fsyncs = Metric(*text, "etcd_disk_wal_fsync_duration_seconds_count");
    if (fsyncs > counters.fsyncs) {
      counters.fsyncs = fsyncs;
      counters.fsync_seconds = Metric(*text, "etcd_disk_wal_fsync_duration_seconds_sum");
    }
    counters.proposals =
        std::max(counters.proposals, Metric(*text, "etcd_server_proposals_committed_total"));
  }
  for (int pid : pids) counters.etcd_cpu_s += ProcessCpuSeconds(pid);
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  counters.bench_cpu_s = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6 +
                         usage.ru_stime.tv_sec + usage.ru_stime.tv_usec / 1e6;
  return counters;
}

// "etcd: 40 fsyncs (1.9 ms each), 35 proposals, etcd CPU 0.31 s, bench CPU 0.52 s".
std::string DescribeWork(const Counters& before, const Counters& after, bool own_cluster) {
  std::string out;
  if (before.metrics && after.metrics) {
    const double fsyncs = after.fsyncs - before.fsyncs;
    absl::StrAppend(&out, "etcd: ", static_cast<int64_t>(fsyncs), " WAL fsyncs");
    if (fsyncs > 0) {
      absl::StrAppend(
          &out, " (",
          absl::StrFormat("%.2f", 1e3 * (after.fsync_seconds - before.fsync_seconds) / fsyncs),
          " ms each)");
    }
    absl::StrAppend(&out, ", ", static_cast<int64_t>(after.proposals - before.proposals),
                    " proposals; ");
  }
  if (own_cluster) {
    absl::StrAppend(&out, "CPU: etcd ",
                    absl::StrFormat("%.2f", after.etcd_cpu_s - before.etcd_cpu_s), " s, ");
  } else {
    absl::StrAppend(&out, "CPU: ");
  }
  absl::StrAppend(&out, "bench ", absl::StrFormat("%.2f", after.bench_cpu_s - before.bench_cpu_s),
                  " s");
  return out;
}

int ThreadCount() {
  std::ifstream file("/proc/self/status");
  std::string line;
  while (std::getline(file, line)) {
    int threads = 0;
    if (absl::StartsWith(line, "Threads:") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(8)), &threads)) {
      return threads;
    }
  }
  return 0;
}

// Sockets this process holds open (its TCP connections to etcd, and
// gRPC's own few).
int SocketCount() {
  int sockets = 0;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", error)) {
    std::error_code ignored;
    if (absl::StartsWith(std::filesystem::read_symlink(entry.path(), ignored).string(),
                         "socket:")) {
      ++sockets;
    }
  }
  return sockets;
}

struct RunConfig {
  int nodes = 1000;
  int clients = 1;
  bool trace = false;
  std::optional<absl::Duration> attempt_timeout;  // unset: EtcdOptions' default
  absl::Duration timeout = absl::Seconds(120);
  std::vector<std::string> endpoints;
};

// One simulated node. Its results are guarded by Fleet::mu_.
struct Node {
  rdzv::JoinRequest join;
  std::unique_ptr<rdzv::RendezvousClient> client;
  // The same client, for its own callbacks: they run before its destructor
  // returns, while `client` may already be reset.
  rdzv::RendezvousClient* self = nullptr;
  std::optional<absl::StatusOr<Assignment>> first, second;
  SteadyClock::time_point first_at, second_at, changed_at, closed_at;
  bool watching = false;   // WatchStarted came
  bool rejoined = false;   // RoundChanged came and the rejoin was sent
  bool closed = false;     // JobClosed came
  bool closed_ok = false;  // ... and said the job succeeded
  std::optional<absl::Status> watch_end;
};

rdzv::JoinRequest NodeJoinRequest(const std::string& job_id, int nodes, int index,
                                  absl::Duration join_timeout) {
  rdzv::JoinRequest join;
  join.set_job_id(job_id);
  rdzv::JobConfig* job = join.mutable_config();
  job->set_min_nodes(nodes);
  job->set_max_nodes(nodes);
  job->set_max_restarts(3);
  job->set_last_call_timeout_ms(0);
  job->set_join_timeout_ms(absl::ToInt64Milliseconds(join_timeout));
  job->set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(kHeartbeatTimeout));
  rdzv::NodeInfo* info = join.mutable_node();
  char name[32];
  std::snprintf(name, sizeof name, "host-%05d", index);
  info->set_host(name);
  info->set_advertised_addr(name);
  info->set_node_id(absl::StrCat(name, ":", 1000 + index, ":bench"));
  info->set_local_world_size(kLocalWorldSize);
  info->set_node_rank_hint(-1);
  info->set_master_port_candidate(kFirstMasterPort + index % 40'000);
  join.set_protocol_version(rdzv::kProtocolVersion);
  return join;
}

// OK when every assignment in `which` (first or second) is there and they
// agree: group ranks 0..N-1 once each, `round` and `restart_count`, world
// size kLocalWorldSize * N, rank bases that follow, one master.
absl::Status CheckAssignments(const std::vector<Node>& nodes,
                              std::optional<absl::StatusOr<Assignment>> Node::*which, int64_t round,
                              int restart_count) {
  const int n = static_cast<int>(nodes.size());
  int unanswered = 0, failed = 0;
  for (const Node& node : nodes) {
    const std::optional<absl::StatusOr<Assignment>>& got = node.*which;
    if (!got) {
      ++unanswered;
    } else if (!got->ok()) {
      ++failed;
    }
  }
  if (unanswered + failed > 0) {
    std::printf("           %d of %d nodes unanswered, %d refused or timed out\n", unanswered, n,
                failed);
  }
  std::set<int> ranks;
  std::set<std::string> masters;
  for (const Node& node : nodes) {
    const std::optional<absl::StatusOr<Assignment>>& got = node.*which;
    if (!got)
      return absl::DeadlineExceededError(absl::StrCat(node.join.node().node_id(), ": no answer"));
    if (!got->ok())
      return absl::Status(got->status().code(),
                          absl::StrCat(node.join.node().node_id(), ": ", got->status().message()));
    const Assignment& a = **got;
    if (a.round() != round || a.restart_count() != restart_count) {
      return absl::InternalError(absl::StrCat(node.join.node().node_id(), ": round ", a.round(),
                                              " restart_count ", a.restart_count(), ", want ",
                                              round, " and ", restart_count));
    }
    if (a.group_world_size() != n || a.world_size() != kLocalWorldSize * n ||
        a.rank_base() != kLocalWorldSize * a.group_rank()) {
      return absl::InternalError(absl::StrCat(
          node.join.node().node_id(), ": group world size ", a.group_world_size(), ", world size ",
          a.world_size(), ", rank base ", a.rank_base(), " for group rank ", a.group_rank()));
    }
    if (!ranks.insert(a.group_rank()).second) {
      return absl::InternalError(absl::StrCat("group rank ", a.group_rank(), " given twice"));
    }
    masters.insert(absl::StrCat(a.master_addr(), ":", a.master_port()));
  }
  if (ranks.size() != static_cast<size_t>(n) || *ranks.begin() != 0 || *ranks.rbegin() != n - 1) {
    return absl::InternalError("group ranks are not 0..N-1");
  }
  if (masters.size() != 1) return absl::InternalError(absl::StrCat(masters.size(), " masters"));
  return absl::OkStatus();
}

// After a phase that left nodes unanswered: what etcd holds for each of
// them, read while their calls are still pending. Sorts the nodes into: no
// node key; node key but no outbox; an outbox that answers another join
// revision; an outbox that answers this very node key (the leader answered,
// and the client did not deliver it). Prints the counts and an example of each.
void Diagnose(EtcdClient* etcd, const std::string& job_id, const std::vector<std::string>& nodes) {
  const JobKeys keys(job_id);
  std::map<std::string, std::pair<int, std::string>> kinds;
  for (const std::string& node : nodes) {
    std::string kind, example;
    absl::StatusOr<GetResult> key = etcd->Get(keys.node(node));
    absl::StatusOr<GetResult> outbox = etcd->Get(keys.outbox(node));
    if (!key.ok() || !outbox.ok()) {
      kind = "etcd not read";
      example = (!key.ok() ? key.status() : outbox.status()).ToString();
    } else if (!key->kv) {
      kind = "no node key";
      example = node;
    } else if (!outbox->kv) {
      kind = "node key, no outbox";
      example = absl::StrCat(node, " (node key at revision ", key->kv->mod_revision(), ")");
    } else {
      rdzv::EtcdMail mail;
      mail.ParseFromString(outbox->kv->value());
      rdzv::EtcdJoin join;
      join.ParseFromString(key->kv->value());
      const bool same = mail.join_seq() == join.seq();
      kind = same ? "outbox answers this node's join (not delivered)"
                  : "outbox answers another join of the node";
      example = absl::StrCat(
          node, ": join ", join.seq(), " at mod revision ", key->kv->mod_revision(), " (created ",
          key->kv->create_revision(), ", version ", key->kv->version(), "), outbox answers join ",
          mail.join_seq(), mail.has_assignment() ? ", with an assignment" : ", no assignment");
    }
    auto& [count, first] = kinds[kind];
    if (count++ == 0) first = example;
  }
  for (const auto& [kind, seen] : kinds) {
    std::printf("           %d x %s, e.g. %s\n", seen.first, kind.c_str(), seen.second.c_str());
  }
}

struct RunResult {
  std::optional<double> join_ms, restart_ms, close_ms;
  double report_answered_ms = 0, first_changed_ms = 0, last_changed_ms = 0, watch_open_ms = 0;
  double teardown_ms = 0;
  int threads = 0, sockets = 0;
  std::string leader;
  absl::Status join_check = absl::UnknownError("not run"),
               restart_check = absl::UnknownError("not run"),
               close_check = absl::UnknownError("not run");
};

// The nodes of one run and what came back to them.
class Fleet {
 public:
  Fleet(const RunConfig& config, const std::string& job_id,
        const std::vector<std::shared_ptr<EtcdClient>>& clients)
      : config_(config), job_id_(job_id), etcd_(clients[0].get()), nodes_(config.nodes) {
    const std::string target = absl::StrCat("etcd at ", absl::StrJoin(config.endpoints, ","));
    for (int i = 0; i < config.nodes; ++i) {
      nodes_[i].join = NodeJoinRequest(job_id, config.nodes, i, kJoinTimeout);
      EtcdRendezvousOptions options;
      options.etcd = clients[i % clients.size()];
      options.job_id = job_id;
      options.lease_ttl = kHeartbeatTimeout;
      options.target = target;
      nodes_[i].client = NewEtcdRendezvousClient(std::move(options));
      nodes_[i].self = nodes_[i].client.get();
    }
  }

  // Destroys the clients, several at a time: each revokes its lease on the
  // way out, one etcd round trip.
  ~Fleet() { TearDown(); }

  double TearDown() {
    const auto start = SteadyClock::now();
    std::atomic<size_t> next{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 16; ++t) {
      threads.emplace_back([this, &next] {
        for (size_t i = next++; i < nodes_.size(); i = next++) nodes_[i].client.reset();
      });
    }
    for (std::thread& thread : threads) thread.join();
    return MsBetween(start, SteadyClock::now());
  }

  // Every node's Join, sent together. The milliseconds from the first sent
  // to the last answer; nullopt if some are missing at the deadline.
  std::optional<double> JoinAll() {
    const auto start = SteadyClock::now();
    for (Node& node : nodes_) {
      // Longer than the bench waits: an unanswered join's node key is still
      // there for Diagnose.
      node.client->Join(node.join, config_.timeout + absl::Seconds(30),
                        [this, &node](absl::StatusOr<Assignment> got) {
                          absl::MutexLock lock(&mu_);
                          node.first = std::move(got);
                          node.first_at = SteadyClock::now();
                          ++joined_;
                        });
    }
    if (!WaitFor(&joined_)) return std::nullopt;
    absl::MutexLock lock(&mu_);
    auto last = start;
    for (const Node& node : nodes_) last = std::max(last, node.first_at);
    return MsBetween(start, last);
  }

  // Every node's Watch, as an agent opens it: until every WatchStarted
  // came. The milliseconds it took; nullopt if some are missing.
  std::optional<double> WatchAll() {
    const auto start = SteadyClock::now();
    for (Node& node : nodes_) {
      rdzv::WatchRequest request;
      request.set_job_id(job_id_);
      request.set_node_id(node.join.node().node_id());
      {
        absl::MutexLock lock(&mu_);
        request.set_node_secret((*node.first)->node_secret());
        request.set_known_round((*node.first)->round());
      }
      node.client->Watch(
          request, [this, &node](const rdzv::WatchEvent& event) { OnEvent(node, event); },
          [this, &node](absl::Status status) {
            absl::MutexLock lock(&mu_);
            node.watch_end = std::move(status);
          });
    }
    if (!WaitFor(&watching_)) return std::nullopt;
    return MsBetween(start, SteadyClock::now());
  }

  // Node 0 reports a worker failure in its round; every node rejoins on
  // its RoundChanged (OnEvent). Fills the restart figures of `result`.
  void Restart(RunResult* result) {
    Node& reporter = nodes_[0];
    rdzv::ReportFailureRequest request;
    request.set_job_id(job_id_);
    request.set_node_id(reporter.join.node().node_id());
    {
      absl::MutexLock lock(&mu_);
      request.set_node_secret((*reporter.first)->node_secret());
      request.set_round((*reporter.first)->round());
    }
    rdzv::Failure* failure = request.mutable_failure();
    failure->set_rank(0);
    failure->set_host(reporter.join.node().host());
    failure->set_pid(4242);
    failure->set_exit_code(1);
    failure->set_time_unix_ms(absl::ToUnixMillis(absl::Now()));
    // Shared with the callback, which may come after a run that timed out.
    struct Answer {
      std::optional<absl::Status> status;
      SteadyClock::time_point at;
    };
    auto answer = std::make_shared<Answer>();
    const auto start = SteadyClock::now();
    reporter.client->ReportFailure(request, config_.timeout, [this, answer](absl::Status status) {
      absl::MutexLock lock(&mu_);
      answer->status = std::move(status);
      answer->at = SteadyClock::now();
    });
    const bool all = WaitFor(&rejoined_);
    if (!all)
      Diagnose(etcd_, job_id_, [this] {
        absl::MutexLock lock(&mu_);
        std::vector<std::string> missing;
        for (const Node& node : nodes_) {
          if (!node.second) missing.push_back(node.join.node().node_id());
        }
        return missing;
      }());
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](Answer* a) { return a->status.has_value(); }, answer.get()),
                         absl::Seconds(5));
    if (answer->status) {
      result->report_answered_ms = MsBetween(start, answer->at);
      if (!answer->status->ok()) {
        result->restart_check = absl::Status(
            answer->status->code(), absl::StrCat("ReportFailure: ", answer->status->message()));
        return;
      }
    } else {
      result->restart_check = absl::DeadlineExceededError("ReportFailure was not answered");
      return;
    }
    if (!all) {
      result->restart_check = absl::DeadlineExceededError(
          absl::StrCat(rejoined_, " of ", nodes_.size(), " nodes joined round 1 in time (",
                       changed_, " saw RoundChanged)"));
      return;
    }
    auto first_changed = SteadyClock::time_point::max(), last_changed = start, last = start;
    for (const Node& node : nodes_) {
      first_changed = std::min(first_changed, node.changed_at);
      last_changed = std::max(last_changed, node.changed_at);
      last = std::max(last, node.second_at);
    }
    result->first_changed_ms = MsBetween(start, first_changed);
    result->last_changed_ms = MsBetween(start, last_changed);
    result->restart_ms = MsBetween(start, last);
    result->restart_check = absl::OkStatus();
  }

  // Every node reports done in round 1: the milliseconds until every watch
  // had JobClosed; nullopt if some are missing. `ok`: each said succeeded.
  std::optional<double> CloseAll(bool* ok) {
    const auto start = SteadyClock::now();
    for (Node& node : nodes_) {
      rdzv::ReportDoneRequest request;
      request.set_job_id(job_id_);
      request.set_node_id(node.join.node().node_id());
      {
        absl::MutexLock lock(&mu_);
        request.set_node_secret((*node.second)->node_secret());
        request.set_round((*node.second)->round());
      }
      node.client->ReportDone(request, config_.timeout, [](absl::Status) {});
    }
    const bool all = WaitFor(&closed_);
    absl::MutexLock lock(&mu_);
    *ok = true;
    auto last = start;
    for (const Node& node : nodes_) {
      *ok = *ok && node.closed_ok;
      last = std::max(last, node.closed_at);
    }
    if (!all) return std::nullopt;
    return MsBetween(start, last);
  }

  std::vector<Node>& nodes() { return nodes_; }
  // The nodes whose first join has no answer.
  std::vector<std::string> Unjoined() {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (const Node& node : nodes_) {
      if (!node.first) out.push_back(node.join.node().node_id());
    }
    return out;
  }
  absl::Mutex& mu() { return mu_; }

 private:
  // On a gRPC thread of the node's watch, before its client's destructor returns.
  void OnEvent(Node& node, const rdzv::WatchEvent& event) {
    std::optional<rdzv::JoinRequest> rejoin;
    {
      absl::MutexLock lock(&mu_);
      if (event.has_watch_started() && !node.watching) {
        node.watching = true;
        ++watching_;
      }
      if (event.has_round_changed() && !node.rejoined && node.first && node.first->ok()) {
        node.rejoined = true;
        node.changed_at = SteadyClock::now();
        ++changed_;
        rejoin = node.join;
        rejoin->set_node_secret((*node.first)->node_secret());
      }
      if (event.has_job_closed() && !node.closed) {
        node.closed = true;
        node.closed_ok = event.job_closed().succeeded();
        node.closed_at = SteadyClock::now();
        ++closed_;
      }
    }
    // Outside mu_: a client that is stopping answers at once, on this thread.
    if (rejoin) {
      node.self->Join(*rejoin, config_.timeout + absl::Seconds(30),
                      [this, &node](absl::StatusOr<Assignment> got) {
                        absl::MutexLock lock(&mu_);
                        node.second = std::move(got);
                        node.second_at = SteadyClock::now();
                        ++rejoined_;
                      });
    }
  }

  // Until *count reaches the number of nodes, or the run's timeout.
  bool WaitFor(int* count) {
    absl::MutexLock lock(&mu_);
    struct Arg {
      int* count;
      int want;
    } arg{count, static_cast<int>(nodes_.size())};
    return mu_.AwaitWithTimeout(absl::Condition(
                                    +[](Arg* a) { return *a->count >= a->want; }, &arg),
                                config_.timeout);
  }

  const RunConfig config_;
  const std::string job_id_;
  EtcdClient* const etcd_;  // for Diagnose; outlives the fleet
  absl::Mutex mu_;
  std::vector<Node> nodes_;  // fixed size; the results in it are guarded by mu_
  int joined_ ABSL_GUARDED_BY(mu_) = 0;
  int watching_ ABSL_GUARDED_BY(mu_) = 0;
  int changed_ ABSL_GUARDED_BY(mu_) = 0;
  int rejoined_ ABSL_GUARDED_BY(mu_) = 0;
  int closed_ ABSL_GUARDED_BY(mu_) = 0;
};

// With --trace: what the leader wrote to the job's outboxes during a phase,
// seen by one more watch (on the outbox prefix): for each revision (one
// transaction of the leader) how many outboxes it wrote and when its events
// arrived, in ms after the phase began. Tells the leader's batches apart
// from the rest of a phase.
class OutboxTrace {
 public:
  // Starts watching at the store's current revision; nullptr (and a line on
  // stderr) if etcd could not be read.
  static std::unique_ptr<OutboxTrace> Start(EtcdClient* client, const std::string& job_id) {
    const std::string prefix = JobKeys(job_id).outbox();
    absl::StatusOr<GetResult> now = client->Get(prefix);
    if (!now.ok()) {
      std::fprintf(stderr, "etcd_scale: --trace: %s\n", now.status().ToString().c_str());
      return nullptr;
    }
    auto trace = std::unique_ptr<OutboxTrace>(new OutboxTrace());
    OutboxTrace* self = trace.get();
    trace->watch_ = client->Watch(
        prefix, PrefixEnd(prefix), now->revision + 1,
        [self](const std::vector<mvccpb::Event>& events, int64_t) {
          const auto at = SteadyClock::now();
          absl::MutexLock lock(&self->mu_);
          for (const mvccpb::Event& event : events) {
            auto [it, fresh] = self->revisions_.try_emplace(event.kv().mod_revision(), at, 0);
            ++it->second.second;
          }
        },
        [](absl::Status status) {
          std::fprintf(stderr, "etcd_scale: --trace: the watch ended: %s\n",
                       status.ToString().c_str());
        });
    return trace;
  }

  // "3 transactions: 120 keys @12 ms, ..." for what came after `start`.
  // Waits a little first for events still on their way.
  std::string Describe(SteadyClock::time_point start) {
    absl::SleepFor(absl::Milliseconds(200));
    absl::MutexLock lock(&mu_);
    std::string out;
    int count = 0;
    for (const auto& [revision, seen] : revisions_) {
      if (seen.first < start) continue;
      absl::StrAppend(&out, count == 0 ? "" : ", ", seen.second, "@",
                      absl::StrFormat("%.0f", MsBetween(start, seen.first)));
      ++count;
    }
    revisions_.clear();
    return absl::StrCat(count, " leader transactions to the outboxes (keys@ms): ", out);
  }

 private:
  OutboxTrace() = default;
  absl::Mutex mu_;
  // revision -> (when its first event arrived, how many outboxes it wrote)
  std::map<int64_t, std::pair<SteadyClock::time_point, int>> revisions_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<EtcdWatch> watch_;  // last: destroyed first, before what it writes to
};

RunResult RunOne(const RunConfig& config, int run, const std::vector<int>& etcd_pids) {
  RunResult result;
  const bool own = !etcd_pids.empty();
  const std::string job_id = absl::StrCat("etcd-scale-", config.nodes, "-", ::getpid(), "-", run);
  std::vector<std::shared_ptr<EtcdClient>> clients;
  for (int k = 0; k < config.clients; ++k) {
    EtcdOptions options;
    options.endpoints = config.endpoints;
    if (config.attempt_timeout) options.attempt_timeout = *config.attempt_timeout;
    std::rotate(options.endpoints.begin(), options.endpoints.begin() + k % options.endpoints.size(),
                options.endpoints.end());
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(std::move(options));
    if (!client.ok()) {
      result.join_check = client.status();
      return result;
    }
    clients.push_back(*std::move(client));
  }
  std::printf("run %d: job %s, %d nodes on %d etcd client(s)\n", run, job_id.c_str(), config.nodes,
              config.clients);
  std::fflush(stdout);
  Fleet fleet(config, job_id, clients);

  std::unique_ptr<OutboxTrace> trace =
      config.trace ? OutboxTrace::Start(clients[0].get(), job_id) : nullptr;
  Counters before = ReadCounters(config.endpoints, etcd_pids);
  auto phase_start = SteadyClock::now();
  result.join_ms = fleet.JoinAll();
  Counters after = ReadCounters(config.endpoints, etcd_pids);
  {
    absl::MutexLock lock(&fleet.mu());
    result.join_check = result.join_ms ? CheckAssignments(fleet.nodes(), &Node::first, 0, 0)
                                       : absl::DeadlineExceededError("not every node was answered");
  }
  if (!result.join_ms) {
    Diagnose(clients[0].get(), job_id, fleet.Unjoined());
    if (absl::StatusOr<GetResult> leader = clients[0]->Get(JobKeys(job_id).leader()); leader.ok()) {
      absl::StatusOr<GetResult> state = clients[0]->Get(JobKeys(job_id).state());
      std::printf("           leader key: %s; state key: %s\n",
                  leader->kv ? absl::StrCat(leader->kv->value(), " (created at revision ",
                                            leader->kv->create_revision(), ", lease ",
                                            leader->kv->lease(), ")")
                                   .c_str()
                             : "none",
                  state.ok() && state->kv ? "written" : "none");
    }
  }
  if (absl::StatusOr<GetResult> leader = clients[0]->Get(JobKeys(job_id).leader());
      leader.ok() && leader->kv) {
    result.leader = leader->kv->value();
  }
  std::printf("  join     %s  [%s]  %s\n",
              result.join_ms ? absl::StrFormat("%8.0f ms", *result.join_ms).c_str() : "  missing",
              result.join_check.ok() ? "ok" : std::string(result.join_check.message()).c_str(),
              DescribeWork(before, after, own).c_str());
  if (trace) std::printf("           %s\n", trace->Describe(phase_start).c_str());
  std::fflush(stdout);

  if (result.join_check.ok()) {
    const std::optional<double> watch_ms = fleet.WatchAll();
    result.threads = ThreadCount();
    result.sockets = SocketCount();
    if (!watch_ms) {
      result.restart_check = absl::DeadlineExceededError("not every watch started");
    } else {
      result.watch_open_ms = *watch_ms;
      before = ReadCounters(config.endpoints, etcd_pids);
      phase_start = SteadyClock::now();
      fleet.Restart(&result);
      after = ReadCounters(config.endpoints, etcd_pids);
      {
        absl::MutexLock lock(&fleet.mu());
        if (result.restart_check.ok()) {
          result.restart_check = CheckAssignments(fleet.nodes(), &Node::second, 1, 1);
        }
      }
    }
    std::printf(
        "  restart  %s  [%s]  %s\n",
        result.restart_ms ? absl::StrFormat("%8.0f ms", *result.restart_ms).c_str() : "  missing",
        result.restart_check.ok() ? "ok" : std::string(result.restart_check.message()).c_str(),
        DescribeWork(before, after, own).c_str());
    std::printf(
        "           watches open in %.0f ms; after the report: answered %.0f ms, first "
        "RoundChanged %.0f ms, last %.0f ms; %d threads and %d sockets in this process\n",
        result.watch_open_ms, result.report_answered_ms, result.first_changed_ms,
        result.last_changed_ms, result.threads, result.sockets);
    if (trace) std::printf("           %s\n", trace->Describe(phase_start).c_str());
    std::fflush(stdout);
  }
  if (result.restart_check.ok()) {
    bool succeeded = false;
    before = ReadCounters(config.endpoints, etcd_pids);
    phase_start = SteadyClock::now();
    result.close_ms = fleet.CloseAll(&succeeded);
    after = ReadCounters(config.endpoints, etcd_pids);
    result.close_check = !result.close_ms ? absl::DeadlineExceededError("not every JobClosed came")
                         : succeeded      ? absl::OkStatus()
                                          : absl::InternalError("a JobClosed said failed");
    std::printf(
        "  close    %s  [%s]  %s\n",
        result.close_ms ? absl::StrFormat("%8.0f ms", *result.close_ms).c_str() : "  missing",
        result.close_check.ok() ? "ok" : std::string(result.close_check.message()).c_str(),
        DescribeWork(before, after, own).c_str());
    if (trace) std::printf("           %s\n", trace->Describe(phase_start).c_str());
  }
  trace.reset();
  result.teardown_ms = fleet.TearDown();
  std::printf("  teardown %8.0f ms (every client destroyed, its lease revoked); leader was %s\n",
              result.teardown_ms, result.leader.empty() ? "?" : result.leader.c_str());
  std::fflush(stdout);
  return result;
}

std::string Summary(std::vector<double> values) {
  if (values.empty()) return "-";
  std::sort(values.begin(), values.end());
  const double median = values[values.size() / 2];
  if (values.size() == 1) return absl::StrFormat("%.0f ms", median);
  return absl::StrFormat("%.0f ms (%.0f-%.0f)", median, values.front(), values.back());
}

struct Plan {
  std::vector<int> node_counts = {1000};
  int repeat = 1;
  int clients = 1;
  int timeout_s = 120;
  std::string endpoints;  // empty: start a cluster
  bool keep_logs = false;
  bool verbose = false;
  bool trace = false;
  int attempt_timeout_ms = 0;  // 0: the client's default
};

int RunPlan(const Plan& plan) {
  EnterReleaseMode();
  SetLogLevel(plan.verbose ? spdlog::level::info : spdlog::level::warn);
  // Stopped when RunPlan returns, its logs kept with --keep-logs.
  std::unique_ptr<TestCluster> cluster;
  absl::Cleanup stop = [&] {
    if (cluster == nullptr) return;
    if (absl::Status stopped = cluster->Stop(plan.keep_logs); !stopped.ok()) {
      std::fprintf(stderr, "etcd_scale: %s\n", stopped.ToString().c_str());
    }
  };
  std::string endpoint_text = plan.endpoints;
  if (endpoint_text.empty()) {
    cluster = std::make_unique<TestCluster>();
    cluster->Start();
    if (!cluster->skip().empty() || !cluster->status().ok()) {
      std::fprintf(stderr, "etcd_scale: %s\n",
                   !cluster->skip().empty() ? cluster->skip().c_str()
                                            : cluster->status().ToString().c_str());
      return 1;
    }
    endpoint_text = absl::StrJoin(cluster->endpoints(), ",");
  }
  absl::StatusOr<EtcdEndpoints> endpoints = ParseEtcdEndpoints(endpoint_text);
  if (!endpoints.ok()) {
    std::fprintf(stderr, "etcd_scale: --endpoints: %s\n",
                 std::string(endpoints.status().message()).c_str());
    return 2;
  }
  const std::vector<int> pids = cluster ? cluster->MemberPids() : std::vector<int>();
  std::printf("etcd at %s (%s); goal (issue 12): the restart round of 1,000 nodes in at most 2 s\n",
              endpoint_text.c_str(), cluster ? "started by the bench" : "given");
  bool all_ok = true;
  std::vector<std::string> rows;
  for (int n : plan.node_counts) {
    RunConfig config;
    config.nodes = n;
    config.clients = plan.clients;
    config.trace = plan.trace;
    if (plan.attempt_timeout_ms > 0) {
      config.attempt_timeout = absl::Milliseconds(plan.attempt_timeout_ms);
    }
    config.timeout = absl::Seconds(plan.timeout_s);
    config.endpoints = endpoints->endpoints;
    std::vector<double> joins, restarts, closes;
    std::string checks = "ok";
    for (int run = 0; run < plan.repeat; ++run) {
      RunResult result = RunOne(config, run, pids);
      if (result.join_ms && result.join_check.ok()) joins.push_back(*result.join_ms);
      if (result.restart_ms && result.restart_check.ok()) restarts.push_back(*result.restart_ms);
      if (result.close_ms && result.close_check.ok()) closes.push_back(*result.close_ms);
      for (const absl::Status* s :
           {&result.join_check, &result.restart_check, &result.close_check}) {
        if (!s->ok()) {
          checks = std::string(s->message());
          all_ok = false;
          break;
        }
      }
      if (!result.join_check.ok() || !result.restart_check.ok())
        break;  // the next would fare no better
    }
    rows.push_back(absl::StrFormat("%6d | %-22s | %-22s | %-22s | %s", n, Summary(joins),
                                   Summary(restarts), Summary(closes), checks));
  }
  std::printf(
      "\nnodes  | join (median, range)   | restart round          | close                  | "
      "checks\n");
  for (const std::string& row : rows) std::printf("%s\n", row.c_str());
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace muster::etcd::scale

int main(int argc, char** argv) {
  namespace scale = muster::etcd::scale;
  CLI::App app("etcd_scale: N simulated agents of one job on a 3-member etcd cluster");
  scale::Plan plan;
  app.add_option("--nodes", plan.node_counts, "node counts, comma separated")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(1, 10'000));
  app.add_option("--repeat", plan.repeat,
                 "runs per N, each a job of its own; the table shows medians")
      ->capture_default_str()
      ->check(CLI::Range(1, 20));
  app.add_option("--clients", plan.clients,
                 "EtcdClients the nodes share (node i uses client i % K; client k starts at "
                 "member k % 3)")
      ->capture_default_str()
      ->check(CLI::Range(1, 10'000));
  app.add_option("--timeout", plan.timeout_s, "seconds each phase may take; bounds the run")
      ->capture_default_str()
      ->check(CLI::Range(1, 600));
  app.add_option("--endpoints", plan.endpoints,
                 "use this running etcd cluster (HOST:PORT,...) instead of starting one with "
                 "tests/etcd/cluster.sh");
  app.add_flag("--keep-logs", plan.keep_logs, "keep the started cluster's directory (its logs)");
  app.add_flag("--verbose", plan.verbose, "the rendezvous' info lines on stderr");
  app.add_flag("--trace", plan.trace,
               "one more watch, on the job's outboxes: print the leader's transactions to them "
               "in each phase (how many outboxes each wrote, when its events arrived)");
  app.add_option("--attempt-timeout-ms", plan.attempt_timeout_ms,
                 "EtcdOptions::attempt_timeout of the bench's clients (0: the default, 1 s); "
                 "short ones make the client repeat calls on the next member, as a loaded etcd "
                 "does")
      ->capture_default_str()
      ->check(CLI::Range(0, 60'000));
  CLI11_PARSE(app, argc, argv);
  return scale::RunPlan(plan);
}
