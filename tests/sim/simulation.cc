#include "tests/sim/simulation.h"

#include <signal.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "agent/elastic_state.h"
#include "agent/exit_codes.h"
#include "agent/peer_endpoint.h"
#include "common/clock.h"
#include "rendezvous/rules/protocol.h"
#include "rendezvous/rules/state.h"
#include "rendezvous/server/hub.h"
#include "rendezvous/server/journal.h"

namespace muster::sim {
namespace {

using absl::Duration;
using absl::Time;
using rdzv::Assignment;
using rdzv::JournalRecord;

const Time kEpoch = absl::FromUnixSeconds(1'750'000'000);
constexpr char kJob[] = "job";
// musterd's host, or etcd's: never cut, never stopped (its crashes are
// kServerCrash).
constexpr int kMusterdHost = -1;
// How often the etcd model looks at leases (kept alive, ended) and at who leads.
constexpr Duration kLeaseTick = absl::Milliseconds(250);

// What the real edges do, as the simulation models them.
constexpr Duration kRpcTimeout = absl::Seconds(10);  // agent.cc: every call but a join
constexpr Duration kJoinSlack =
    absl::Seconds(5);  // agent.cc: a join's deadline beyond join_timeout
constexpr Duration kLeaveTimeout = absl::Seconds(1);
// The server's TCP keepalive (1 s, 3 probes) finds a cut link.
constexpr Duration kServerFindsCut = absl::Seconds(3);
// A schedule steps through a few thousand events; far more is a loop.
constexpr int64_t kMaxSteps = 1'000'000;
// A failure's worker exits within this of SIGTERM at most (else SIGKILL).
constexpr double kSlowStopShare = 0.2;

// A request for the job from `node_id`, with its secret.
template <typename Request>
Request Addressed(const std::string& node_id, const std::string& secret) {
  Request request;
  request.set_job_id(kJob);
  request.set_node_id(node_id);
  request.set_node_secret(secret);
  return request;
}

std::string Seconds(Duration d) { return absl::StrFormat("%.3f s", absl::ToDoubleSeconds(d)); }

// A journal in memory (musterd --state-dir's file, as the hub writes it).
class MemoryJournal final : public rdzv::JournalWriter {
 public:
  explicit MemoryJournal(Breakage breakage) : breakage_(breakage) {}

  absl::StatusOr<uint64_t> Append(const std::vector<JournalRecord>& records) override {
    last_write_ = records_.size();
    for (JournalRecord record : records) records_.push_back(Broken(std::move(record)));
    return ++written_;
  }
  absl::Status SyncTo(uint64_t) override { return absl::OkStatus(); }
  uint64_t written() const override { return written_; }
  bool WantsCompaction() const override { return records_.size() > 40; }
  absl::Status Compact(const std::vector<JournalRecord>& snapshot) override {
    records_.clear();
    for (JournalRecord record : snapshot) records_.push_back(Broken(std::move(record)));
    last_write_ = records_.size();
    ++compactions_;
    return absl::OkStatus();
  }

  // musterd died while its last write was under way: `kept` of its records
  // (a share) are read back, the rest of the tail is torn.
  void Tear(double kept) {
    const size_t written = records_.size() - last_write_;
    records_.resize(last_write_ + static_cast<size_t>(kept * static_cast<double>(written)));
    last_write_ = records_.size();
  }

  const std::string& path() const override { return path_; }
  const std::vector<JournalRecord>& records() const { return records_; }
  int compactions() const { return compactions_; }

 private:
  JournalRecord Broken(JournalRecord record) const {
    if (breakage_ != Breakage::kRestartCountNotJournaled) return record;
    if (record.has_round_formed()) record.mutable_round_formed()->set_restart_count(0);
    if (record.has_round_opened()) record.mutable_round_opened()->set_restart_count(0);
    if (record.has_job_ended()) record.mutable_job_ended()->set_restart_count(0);
    return record;
  }

  const Breakage breakage_;
  const std::string path_ = "(memory)";
  std::vector<JournalRecord> records_;
  size_t last_write_ = 0;
  uint64_t written_ = 0;
  int compactions_ = 0;
};

// One worker process of an agent.
struct Worker {
  int rank = 0;
  int local_rank = 0;
  int64_t round = -1;
  int pid = 0;
  bool alive = true;
};

// One agent process: the elastic rules, carried out over the network.
struct Agent {
  Agent(int uid_, int host_, int incarnation, ElasticOptions options)
      : uid(uid_), host(host_), node_id(absl::StrCat("h", host_, ".", incarnation)),
        state(std::move(options)) {}

  const int uid;
  const int host;
  const std::string node_id;
  ElasticState state;
  std::string secret;  // the rendezvous' word for this node
  bool alive = true;
  bool stopped = false;  // SIGSTOP
  // Time spent stopped, for the split-brain bound (a stopped agent cannot act).
  Duration stopped_total;
  Time stopped_since;
  std::vector<std::function<void()>> inbox;  // what waits for a stopped agent
  std::vector<Worker> workers;
  std::optional<Time> timer_at;
  uint64_t timer_generation = 0;
  // Calls in flight: how to end each one when its connection breaks.
  std::map<uint64_t, std::function<void(absl::Status)>> calls;
  // The watch stream: the generation the rules gave it, the hub's ticket
  // (0: not open there), and whether the agent's side believes it open.
  uint64_t watch_generation = 0;
  uint64_t watch_ticket = 0;
  bool watch_open = false;
  Time stream_at;  // the last delivery on the stream: events arrive in order
  uint64_t join_ticket = 0;
  uint64_t joins_sent = 0;      // this agent's Join calls, counted
  uint64_t join_at_server = 0;  // which of them join_ticket is
  // etcd: serves the join pending at the leader again (a new leader reads
  // its key), and the watch of etcd that outlives leaders.
  std::function<void()> join_replay;
  std::function<void()> watch_attach;
  std::function<void(absl::Status)> watch_end;  // its outbox deleted
  // What the checker needs.
  bool signaled = false;
  std::optional<rdzv::JobClosed> told_closed;
  std::optional<int> exit_code;
  int64_t succeeded_round = -1;  // its workers all exited 0 in this round
  // Its round's peers (Assignment.peers), by node id, and that round.
  std::vector<std::string> peers;
  int64_t peers_round = -1;
  // The rounds whose questions it answers: the last PeerEndpoint::kKeptRounds it ran in.
  std::deque<int64_t> rounds_kept;

  // Alive, with a worker of `round` alive.
  bool RunsRound(int64_t round) const {
    return alive && std::any_of(workers.begin(), workers.end(),
                                [round](const Worker& w) { return w.alive && w.round == round; });
  }
};

// A connection between a host and the rendezvous' host.
struct Link {
  std::optional<Time> cut_until;
  // Only its route to the rendezvous' host is down (a firewall, a route):
  // the other hosts still reach it.
  std::optional<Time> rdzv_cut_until;
  uint64_t epoch = 0;              // bumped when the connection breaks
  bool client_must_learn = false;  // broken while the agent could not see it
  bool client_knows_down = false;  // the agent found it broken, and the link is still down
};

// A round as the assignments describe it (the checker's record).
struct RoundSeen {
  int world_size = 0;
  int restart_count = 0;
  int group_world_size = 0;
  std::string master;
  std::string peer_key;
  std::map<int, int> group_ranks;               // group rank -> agent uid
  std::vector<std::pair<int, int>> rank_spans;  // [base, base + count)
  int started_ranks = 0;
  int live_ranks = 0;
  bool broken = false;  // a rank stopped before the round succeeded
  bool succeeded = false;
};

class World {
 public:
  World(const Schedule& schedule, const RunOptions& options);
  Outcome Run();

 private:
  // The event queue.
  struct Step {
    Time at;
    uint64_t seq;
    std::function<void()> run;
  };
  void At(Time at, std::function<void()> run);
  Time Now() const { return clock_.Now(); }
  double Uniform() { return std::uniform_real_distribution<double>(0, 1)(rng_); }
  Duration Between(Duration low, Duration high);
  void Note(absl::string_view what);
  void Violation(const std::string& what);

  // Faults.
  void Inject(const Fault& fault);
  Agent* LiveAgentOn(int host);
  void StartAgent(int host);
  void KillAgent(Agent& agent);
  void StopAgent(Agent& agent, Duration length);
  void ResumeAgent(int uid);
  void CutLink(int host, Duration length);
  void HealLink(int host);
  // The agent of `host`, running, finds its connection dead by its pings.
  void AgentPingsFindCut(int host);
  void CrashServer(double torn, Duration down);
  void StartServer();

  // The etcd backend (Backend::kEtcd).
  bool Etcd() const { return shape_.backend == Backend::kEtcd; }
  // Its keep-alives get through: it runs, and its route to etcd is up.
  bool ReachesEtcd(const Agent& agent) const;
  // The agent's live lease (0: none); `grant`: one is granted if it has
  // none, as the backend does before it writes a key.
  int64_t LeaseOf(int uid, bool grant);
  // Leases kept alive or ended, and a leader elected if none leads; again
  // every kLeaseTick.
  void TickLeases();
  void LeaseEnds(Agent& agent);
  // The leader drops the node whose lease ended (as leader.cc's NodeGone).
  void DropFromEtcd(int uid, const std::string& why);
  // The leader's lease ended: its hub is gone, another agent takes over.
  void LeaderLost();
  void ElectLeader();
  // The whole cluster away for `length`: leases hold, renewed when it is back.
  void EtcdAway(Duration length);
  // The leader can act again (resumed, its route back, etcd back): what
  // waited for it is served.
  void ServerMayResume();
  // What the node's outbox says: the round the leader last wrote (its
  // state, or what the journal says while no leader acts).
  absl::StatusOr<int64_t> EtcdOutbox(const rdzv::HeartbeatRequest& request);
  // A heartbeat reads the outbox, once its lease is known to be live.
  absl::StatusOr<int64_t> EtcdHeartbeat(int uid, const rdzv::HeartbeatRequest& request);
  void OpenEtcdWatch(Agent& agent, const action::OpenWatch& open);
  // The watch the agent opens, as it sees it: the request it sends.
  rdzv::WatchRequest BeginWatch(Agent& agent, const action::OpenWatch& open);

  // The network.
  // musterd's host, etcd's, or host 0 in host mode.
  int ServerHost() const { return schedule_.shape.backend == Backend::kHost ? 0 : kMusterdHost; }
  bool Cut(int host) const;
  // The connection of `host` to the rendezvous' host has no link (either end cut).
  bool LinkDown(int host) const;
  std::optional<Time> LinkBackAt(int host) const;
  // The rendezvous in host 0's agent dies with it.
  void HostedServerDies();
  // Only `cut`'s route to the rendezvous' host goes down, for `length`.
  void CutFromRendezvous(int cut, Duration length);
  // The connection of `host` to the rendezvous breaks, as each end finds out.
  void ConnectionsFindCut(int host);
  // A link or route is back: agents learn what broke meanwhile.
  void LinksBack();
  Link& LinkOf(int host) { return links_[host]; }
  Duration Delay();
  // Carries `deliver` between `host` and the rendezvous' host, either way,
  // over the connection as it is now: held while the link is cut (TCP
  // retransmits), dropped if the connection breaks meanwhile.
  void Carry(int host, std::function<void()> deliver, std::optional<Time> at = std::nullopt);
  void CarryAt(int host, uint64_t epoch, Time at, std::function<void()> deliver);
  // The connection of `host` broke: the server ends what it had of it now;
  // the agent learns now (`client_now`), or when it next can.
  void BreakConnection(int host, bool client_now);
  void ClientLearnsBreak(Agent& agent);
  void ServerForgetsAgent(Agent& agent);

  // The rendezvous.
  bool ServerUp() const;
  bool ServerStopped() const;
  // Runs `serve` on the server as one step: the crash armed, the journal
  // check, the timer. Held while the server's process is stopped, so
  // `serve` owns what it uses.
  void ServerStep(std::function<void()> serve);
  // A request from `host` that arrived: served as a step, unless its
  // connection broke before the server got to it.
  void Serve(int host, std::function<void()> serve);
  void ArmServerTimer();
  void CheckJournal();
  // How a call is served: by the rendezvous (musterd, the hosting agent,
  // the etcd leader), or by etcd itself (what the leader wrote).
  enum class By { kRendezvous, kEtcd };
  // `replay`: where to keep what serves it again (Agent::join_replay).
  template <typename R>
  void Call(Agent& agent, Duration timeout, bool wait_for_ready,
            std::function<void(std::function<void(R)>)> serve, std::function<void(Agent&, R)> done,
            By by = By::kRendezvous, std::function<void()> Agent::*replay = nullptr);

  // The agents.
  Agent* Find(int uid) {
    return uid < static_cast<int>(agents_.size()) ? agents_[uid].get() : nullptr;
  }
  // Runs `event` in the agent's process (queued while it is stopped).
  void Post(int uid, std::function<void()> event);
  void Do(Agent& agent, Actions actions);
  void DoOne(Agent& agent, Action& action);
  // Each action, as agent.cc carries it out, over the simulated network.
  void Perform(Agent& agent, const action::Join& join);
  void Perform(Agent& agent, const action::StartWorkers& start);
  void Perform(Agent& agent, const action::SignalWorkers& signal);
  void Perform(Agent& agent, const action::AbandonWorkers&);
  void Perform(Agent& agent, const action::ReportFailure& report);
  void Perform(Agent& agent, const action::ReportDone& done);
  void Perform(Agent& agent, const action::SendHeartbeat& beat);
  void Perform(Agent& agent, const action::OpenWatch& open);
  void Perform(Agent& agent, const action::QueryStatus&);
  void Perform(Agent& agent, const action::AskPeers& ask);
  void CheckPeers(const Agent& agent, const Assignment& a, const RoundSeen& round);
  void Perform(Agent& agent, const action::Log& log);
  void Perform(Agent& agent, const action::Exit& exit);
  void Perform(Agent& agent, const action::ReadProgress&);
  void Perform(Agent& agent, const action::CheckHealth&);
  void Perform(Agent& agent, const action::ExcludeSelf&);
  void Unmodelled(Agent& agent);
  void SendJoin(Agent& agent, const action::Join& join);
  // The answer `status` told the agent that the job succeeded.
  void NoteClosed(Agent& agent, const absl::Status& status);
  void StartWorkers(Agent& agent, const action::StartWorkers& start);
  void SignalWorkers(Agent& agent, int sig);
  void WorkerExited(Agent& agent, int pid, ExitStatus status);
  void OpenWatch(Agent& agent, const action::OpenWatch& open);
  // Asks the other agents of the round, host to host.
  void AskPeers(Agent& agent, const action::AskPeers& ask);
  bool PeerLinkUp(int a, int b) const { return !Cut(a) && !Cut(b); }
  void AgentExits(Agent& agent, const action::Exit& exit);
  void ArmAgentTimer(Agent& agent);

  // The checker.
  void CheckAssignment(const Agent& agent, const Assignment& assignment);
  void CheckRoundSucceeds(int64_t round);
  void CheckExit(const Agent& agent, int code);
  void CheckSplitBrain();
  // Two or more nodes still run `round`'s workers, every one cut off from the rendezvous.
  bool RoundCutOff(int64_t round) const;
  void CheckEnd();
  Duration SplitBrainBound(int64_t round) const;
  // How often the agent pings the rendezvous; twice this finds it gone.
  Duration ClientKeepalive() const;
  Duration LivenessBound() const;

  const Schedule& schedule_;
  const RunOptions options_;
  const JobShape& shape_;
  FakeClock clock_{kEpoch};
  std::mt19937_64 rng_;
  std::vector<Step> queue_;
  uint64_t seq_ = 0;
  Outcome outcome_;

  std::vector<std::unique_ptr<Agent>> agents_;
  std::map<int, int> incarnations_;  // per host
  std::map<int, Link> links_;
  int next_pid_ = 100;
  uint64_t next_call_ = 0;

  // The rendezvous.
  std::shared_ptr<MemoryJournal> journal_;
  std::unique_ptr<rdzv::RendezvousHub> hub_;
  int server_generation_ = 0;  // bumped at each crash: the old hub's answers are dropped
  bool server_down_ = false;
  bool dropping_ = false;  // the server dies in this step: nothing leaves it
  std::optional<double> crash_armed_;
  Duration crash_down_;
  std::optional<Time> server_timer_at_;
  std::vector<std::function<void()>> server_inbox_;  // host mode: its agent is stopped
  // Calls that wait for the server to be up (wait_for_ready), sent when it is.
  std::vector<std::function<void()>> waiting_for_server_;
  std::vector<rdzv::JobEvent> step_events_;
  std::optional<rdzv::JobEvent> closed_;  // the job's close, as delivered
  // etcd: the agent that leads (its uid), each live lease (by uid: until
  // when it holds, and its last keep-alive), and whether etcd is away.
  std::optional<int> leader_;
  struct Lease {
    Time until;
    Time kept;   // its last keep-alive
    int64_t id;  // a key written under it goes when it does
  };
  std::map<int, Lease> leases_;
  int64_t last_lease_ = 0;
  bool etcd_down_ = false;
  // Agents whose join the lost leader had pending: the next one reads it.
  std::vector<int> unled_joins_;

  // The checker's records.
  // By RoundKey: a job forgotten and made anew under its id starts at round 0.
  std::map<int64_t, RoundSeen> rounds_;
  int64_t job_incarnation_ = 0;
  int64_t RoundKey(int64_t round) const { return job_incarnation_ * 1'000'000'000 + round; }
  int max_restart_seen_ = 0;
  int failures_injected_ = 0;
  // Workers of a round older than one started on their seat: since when.
  std::map<std::pair<int, int64_t>, Time> overlap_since_;
  std::map<std::pair<int, int64_t>, Duration> overlap_stopped_at_;
  Time last_fault_end_ = kEpoch;
};

World::World(const Schedule& schedule, const RunOptions& options)
    : schedule_(schedule), options_(options), shape_(schedule.shape), rng_(schedule.seed) {}

void World::At(Time at, std::function<void()> run) {
  queue_.push_back(Step{std::max(at, Now()), seq_++, std::move(run)});
  std::push_heap(queue_.begin(), queue_.end(), [](const Step& a, const Step& b) {
    return a.at != b.at ? a.at > b.at : a.seq > b.seq;
  });
}

Duration World::Between(Duration low, Duration high) { return low + (high - low) * Uniform(); }

void World::Note(absl::string_view what) {
  // FNV-1a over the time and the text: the schedule's fingerprint.
  uint64_t h = outcome_.digest ^ static_cast<uint64_t>(absl::ToInt64Nanoseconds(Now() - kEpoch));
  for (char c : what) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  outcome_.digest = h * 1099511628211ULL;
  if (options_.trace) outcome_.trace.push_back(absl::StrCat(Seconds(Now() - kEpoch), ": ", what));
}

void World::Violation(const std::string& what) {
  if (outcome_.violations.size() >= 8) return;
  outcome_.violations.push_back(absl::StrCat(Seconds(Now() - kEpoch), ": ", what));
  Note(absl::StrCat("VIOLATION ", what));
}

// ---- Faults ----

void World::Inject(const Fault& fault) {
  Note(absl::StrCat("fault: ", Describe(fault)));
  Agent* agent = LiveAgentOn(fault.host);
  switch (fault.kind) {
    case FaultKind::kWorkerFails:
      if (agent == nullptr) return;
      for (Worker& worker : agent->workers) {
        if (!worker.alive) continue;
        ++failures_injected_;
        WorkerExited(*agent, worker.pid, ExitStatus{1, 0});
        return;
      }
      return;
    case FaultKind::kAgentKilled:
      if (agent == nullptr) return;
      if (shape_.backend == Backend::kHost && fault.host == 0) {
        KillAgent(*agent);  // the rendezvous dies with it; nothing restarts it
        return;
      }
      KillAgent(*agent);
      if (fault.length > absl::ZeroDuration()) {
        At(Now() + fault.length, [this, host = fault.host] { StartAgent(host); });
      }
      return;
    case FaultKind::kAgentStopped:
      if (agent != nullptr && !agent->stopped) StopAgent(*agent, fault.length);
      return;
    case FaultKind::kAgentLeaves:
      if (agent == nullptr) return;
      agent->signaled = true;
      Post(agent->uid, [this, uid = agent->uid] {
        Agent* a = Find(uid);
        Do(*a, a->state.OnSignal(SIGTERM, Now()));
      });
      return;
    case FaultKind::kSpareJoins: StartAgent(fault.host); return;
    case FaultKind::kLinkCut:
      if (!Cut(fault.host)) CutLink(fault.host, fault.length);
      return;
    case FaultKind::kRdzvCut:
      if (fault.host != ServerHost() && !LinkOf(fault.host).rdzv_cut_until) {
        CutFromRendezvous(fault.host, fault.length);
      }
      return;
    case FaultKind::kServerCrash:
      if (Etcd() && !etcd_down_) EtcdAway(fault.length);
      if (shape_.backend == Backend::kMusterd && !server_down_ && !crash_armed_) {
        crash_armed_ = fault.torn;
        crash_down_ = fault.length;
        // A crash with no write under way, if none comes soon.
        At(Now() + absl::Milliseconds(500), [this] {
          if (crash_armed_) CrashServer(1, crash_down_);
        });
      }
      return;
  }
}

Agent* World::LiveAgentOn(int host) {
  for (auto& agent : agents_) {
    if (agent->host == host && agent->alive) return agent.get();
  }
  return nullptr;
}

void World::StartAgent(int host) {
  if (LiveAgentOn(host) != nullptr) return;
  const int incarnation = incarnations_[host]++;
  ElasticOptions options;
  options.script = "train.py";
  options.rdzv_target = shape_.backend == Backend::kHost ? "h0:29400"
                        : Etcd()                         ? "etcd at etcd:2379"
                                                         : "musterd:29400";
  options.hosts_rendezvous = shape_.backend == Backend::kHost && host == 0 && incarnation == 0;
  options.join_timeout = shape_.join_timeout;
  options.keep_alive_interval = shape_.keep_alive_interval;
  options.keep_alive_max_attempt = shape_.keep_alive_max_attempt;
  options.shutdown_grace = shape_.shutdown_grace;
  options.progress_poll = absl::ZeroDuration();
  options.ask_peers = true;
  options.heartbeat_with_watch = Etcd();
  options.heartbeat_timeout = shape_.heartbeat_timeout;
  const int uid = static_cast<int>(agents_.size());
  agents_.push_back(std::make_unique<Agent>(uid, host, incarnation, std::move(options)));
  Note(absl::StrCat("agent ", agents_.back()->node_id, " starts"));
  // A new process: a new connection.
  ++LinkOf(host).epoch;
  LinkOf(host).client_must_learn = false;
  Post(uid, [this, uid] {
    Agent* agent = Find(uid);
    Do(*agent, agent->state.Start(Now()));
  });
}

void World::KillAgent(Agent& agent) {
  agent.alive = false;
  agent.exit_code.reset();
  for (Worker& worker : agent.workers) {
    if (!worker.alive) continue;
    worker.alive = false;  // PR_SET_PDEATHSIG
    RoundSeen& round = rounds_[worker.round];
    --round.live_ranks;
    if (!round.succeeded) round.broken = true;
  }
  agent.calls.clear();
  Note(absl::StrCat("agent ", agent.node_id, " killed"));
  if (shape_.backend == Backend::kHost && agent.host == 0) {
    HostedServerDies();
    return;
  }
  // Its kernel closes its connections (FIN): the server hears of it at
  // once, or when the link is back (TCP sends it again), or finds it dead
  // by its probes first.
  Carry(agent.host, [this, host = agent.host] { BreakConnection(host, false); });
}

void World::HostedServerDies() {
  if (hub_ == nullptr || server_down_) return;
  Note("the rendezvous dies with the agent that hosts it");
  server_down_ = true;
  ++server_generation_;
  dropping_ = true;
  hub_.reset();
  dropping_ = false;
  server_timer_at_.reset();
  for (auto& [host, link] : links_) {
    (void)link;
    if (host != 0) BreakConnection(host, !LinkDown(host));
  }
}

void World::StopAgent(Agent& agent, Duration length) {
  agent.stopped = true;
  agent.stopped_since = Now();
  At(Now() + length, [this, uid = agent.uid] { ResumeAgent(uid); });
  // The server's pings go unanswered: it closes the connection.
  const Duration ping =
      shape_.backend == Backend::kHost
          ? 2 * std::clamp(shape_.heartbeat_timeout / 6, absl::Seconds(1), absl::Seconds(5))
          : absl::Seconds(12 + 5);
  At(Now() + ping, [this, uid = agent.uid, since = agent.stopped_since] {
    Agent* a = Find(uid);
    if (a->alive && a->stopped && a->stopped_since == since) BreakConnection(a->host, false);
  });
}

void World::ResumeAgent(int uid) {
  Agent* agent = Find(uid);
  if (!agent->alive || !agent->stopped) return;
  agent->stopped = false;
  agent->stopped_total += Now() - agent->stopped_since;
  Note(absl::StrCat("agent ", agent->node_id, " resumes"));
  std::vector<std::function<void()>> inbox = std::exchange(agent->inbox, {});
  for (auto& event : inbox) {
    if (!agent->alive || agent->stopped) break;
    event();
  }
  if (LinkOf(agent->host).client_must_learn) {
    if (!LinkDown(agent->host)) {
      ClientLearnsBreak(*agent);  // its next packet is answered with a reset
    } else {
      AgentPingsFindCut(agent->host);
    }
  } else if (LinkDown(agent->host)) {
    AgentPingsFindCut(agent->host);
  }
  if (Etcd() && leader_ == uid) ServerMayResume();
  if (shape_.backend == Backend::kHost && agent->host == 0) {
    std::vector<std::function<void()>> waiting = std::exchange(server_inbox_, {});
    for (auto& serve : waiting) serve();
    ArmServerTimer();
  }
  ArmAgentTimer(*agent);
}

void World::CutLink(int cut, Duration length) {
  LinkOf(cut).cut_until = Now() + length;
  Note(absl::StrCat("link of host ", cut, " cut"));
  // The connections it carried: its own, or every agent's when it is the
  // host of the rendezvous.
  std::vector<int> hosts;
  for (auto& [host, link] : links_) {
    if (host != ServerHost() && (host == cut || cut == ServerHost())) hosts.push_back(host);
  }
  for (int host : hosts) ConnectionsFindCut(host);
  At(Now() + length, [this, cut] { HealLink(cut); });
}

void World::CutFromRendezvous(int cut, Duration length) {
  LinkOf(cut).rdzv_cut_until = Now() + length;
  Note(absl::StrCat("route of host ", cut, " to the rendezvous cut"));
  ConnectionsFindCut(cut);
  At(Now() + length, [this, cut] {
    LinkOf(cut).rdzv_cut_until.reset();
    Note(absl::StrCat("route of host ", cut, " to the rendezvous back"));
    LinksBack();
  });
}

void World::ConnectionsFindCut(int host) {
  const uint64_t epoch = LinkOf(host).epoch;
  // The server's keepalive probes find it first; the agent's pings later.
  At(Now() + kServerFindsCut, [this, host, epoch] {
    if (LinkDown(host) && LinkOf(host).epoch == epoch) BreakConnection(host, false);
  });
  AgentPingsFindCut(host);
}

void World::AgentPingsFindCut(int host) {
  // The agent pings every `keepalive` and gives up when one is not answered
  // within as long (rendezvous/grpc/channel.h).
  const uint64_t epoch = LinkOf(host).epoch;
  At(Now() + 2 * ClientKeepalive(), [this, host, epoch] {
    if (!LinkDown(host)) return;
    if (LinkOf(host).epoch == epoch) BreakConnection(host, false);
    if (Agent* agent = LiveAgentOn(host); agent != nullptr && !agent->stopped) {
      if (LinkOf(host).client_must_learn) ClientLearnsBreak(*agent);
    }
  });
}

void World::HealLink(int healed) {
  LinkOf(healed).cut_until.reset();
  Note(absl::StrCat("link of host ", healed, " back"));
  LinksBack();
}

void World::LinksBack() {
  for (auto& [host, link] : links_) {
    if (host == ServerHost() || LinkDown(host)) continue;
    link.client_knows_down = false;
    // Its next packet on a broken connection is answered with a reset.
    if (Agent* agent = LiveAgentOn(host);
        agent != nullptr && !agent->stopped && link.client_must_learn) {
      ClientLearnsBreak(*agent);
    }
  }
  if (Etcd()) ServerMayResume();  // the leader's route may be back
}

void World::CrashServer(double torn, Duration down) {
  crash_armed_.reset();
  if (server_down_) return;
  journal_->Tear(torn);
  Note(absl::StrCat("musterd crashes, ", journal_->records().size(), " records kept"));
  server_down_ = true;
  ++server_generation_;
  dropping_ = true;
  hub_.reset();  // what it still tells anyone is dropped
  dropping_ = false;
  server_timer_at_.reset();
  for (auto& agent : agents_) {
    agent->watch_ticket = 0;
    agent->join_ticket = 0;
  }
  for (auto& [host, link] : links_) {
    (void)link;
    BreakConnection(host, !LinkDown(host));
  }
  At(Now() + down, [this] { StartServer(); });
}

void World::StartServer() {
  rdzv::HubOptions options;
  options.clock = &clock_;
  options.timer_thread = false;
  // etcd's leader: rendezvous/etcd/leader.cc's LeaderStateOptions.
  options.state.ride_out_outages = shape_.backend != Backend::kHost;
  options.state.external_liveness = Etcd();
  options.state.stream_silence =
      shape_.backend != Backend::kHost
          ? absl::Seconds(5)
          : std::clamp(shape_.heartbeat_timeout / 6, absl::Seconds(1), absl::Seconds(5));
  if (shape_.backend != Backend::kHost) {
    if (journal_ == nullptr) journal_ = std::make_shared<MemoryJournal>(options_.breakage);
    options.journal = journal_;
    options.restore = journal_->records();
  }
  options.on_event = [this](const rdzv::JobEvent& event) { step_events_.push_back(event); };
  hub_ = std::make_unique<rdzv::RendezvousHub>(std::move(options));
  server_down_ = false;
  for (auto& send : std::exchange(waiting_for_server_, {})) send();
  Note(absl::StrCat("rendezvous starts, ", journal_ ? journal_->records().size() : 0,
                    " records restored"));
  if (journal_) CheckJournal();
  ArmServerTimer();
}

// ---- The etcd backend ----

bool World::ReachesEtcd(const Agent& agent) const {
  return agent.alive && !agent.stopped && !LinkDown(agent.host) && !etcd_down_;
}

int64_t World::LeaseOf(int uid, bool grant) {
  auto lease = leases_.find(uid);
  if (lease != leases_.end()) return lease->second.id;
  if (!grant || !Find(uid)->alive) return 0;
  leases_[uid] = Lease{Now() + shape_.heartbeat_timeout, Now(), ++last_lease_};
  return last_lease_;
}

void World::TickLeases() {
  const Duration ttl = shape_.heartbeat_timeout;
  for (auto& agent : agents_) {
    const int uid = agent->uid;
    auto lease = leases_.find(uid);
    if (lease == leases_.end()) continue;  // granted at its next call (LeaseOf)
    if (ReachesEtcd(*agent) && !agent->state.done()) {
      // Its keeper renews it every third of its TTL (etcd's client).
      if (Now() - lease->second.kept >= ttl / 3) {
        lease->second.until = Now() + ttl;
        lease->second.kept = Now();
      }
    } else if (!etcd_down_ && Now() >= lease->second.until) {
      LeaseEnds(*agent);
    }
  }
  if (!leader_) ElectLeader();
  const bool all_done = std::all_of(agents_.begin(), agents_.end(),
                                    [](const auto& a) { return !a->alive || a->state.done(); });
  if (!all_done || Now() <= last_fault_end_) At(Now() + kLeaseTick, [this] { TickLeases(); });
}

void World::DropFromEtcd(int uid, const std::string& why) {
  // The leader drops the node and deletes its outbox, which ends its watch.
  hub_->DropNode(rdzv::NodeKey{kJob, Find(uid)->node_id}, why);
  if (Find(uid)->watch_end) {
    Find(uid)->watch_end(absl::NotFoundError(
        absl::StrCat("node ", Find(uid)->node_id, " is not part of job '", kJob, "'")));
  }
}

void World::LeaseEnds(Agent& agent) {
  leases_.erase(agent.uid);
  Note(absl::StrCat("the etcd lease of ", agent.node_id, " ends"));
  if (leader_ == agent.uid) {
    LeaderLost();
    return;  // the next leader drops every node without a lease
  }
  // Its node key goes with it: the leader drops the node (when it acts).
  if (hub_ != nullptr) {
    ServerStep([this, uid = agent.uid] {
      DropFromEtcd(uid,
                   "lost: its etcd lease ended (the agent died, or could not reach etcd for "
                   "heartbeat_timeout)");
    });
  }
}

void World::LeaderLost() {
  Note(absl::StrCat("the leader ", agents_[*leader_]->node_id, " is gone"));
  // What waited for it is read by the next leader.
  for (auto& agent : agents_) {
    if (agent->alive && agent->join_ticket != 0 && agent->join_replay) {
      unled_joins_.push_back(agent->uid);
    }
    agent->watch_ticket = 0;
    agent->join_ticket = 0;
  }
  ++server_generation_;
  dropping_ = true;
  hub_.reset();  // fenced: nothing it still says is written
  dropping_ = false;
  server_timer_at_.reset();
  leader_.reset();
  ElectLeader();  // or TickLeases, once an agent can lead
}

void World::ElectLeader() {
  if (leader_ || etcd_down_) return;
  std::vector<int> candidates;
  for (auto& agent : agents_) {
    if (ReachesEtcd(*agent) && !agent->state.done() && leases_.contains(agent->uid)) {
      candidates.push_back(agent->uid);
    }
  }
  if (candidates.empty()) return;
  // Every agent campaigns when the leader key goes; the first write wins.
  leader_ = candidates[static_cast<size_t>(Uniform() * static_cast<double>(candidates.size())) %
                       candidates.size()];
  Note(absl::StrCat(agents_[*leader_]->node_id, " leads the rendezvous"));
  StartServer();
  // Members whose node key went while no one led.
  for (auto& agent : agents_) {
    if (leases_.contains(agent->uid)) continue;
    ServerStep([this, uid = agent->uid] {
      DropFromEtcd(uid, "lost: its etcd lease ended while no agent led the rendezvous");
    });
  }
  for (int uid : std::exchange(unled_joins_, {})) {
    if (Find(uid)->alive) Find(uid)->join_replay();
  }
  // The watches of etcd now hear from this leader.
  for (auto& agent : agents_) {
    if (agent->alive && agent->watch_attach) agent->watch_attach();
  }
  ServerMayResume();
}

void World::EtcdAway(Duration length) {
  etcd_down_ = true;
  Note("etcd is away");
  for (auto& [host, link] : links_) {
    (void)link;
    BreakConnection(host, !LinkDown(host));
  }
  At(Now() + length, [this] {
    etcd_down_ = false;
    Note("etcd is back");
    // A new etcd leader renews every lease for a whole TTL.
    for (auto& [uid, lease] : leases_) {
      lease.until = Now() + shape_.heartbeat_timeout;
      lease.kept = Now();
    }
    ServerMayResume();
  });
}

void World::ServerMayResume() {
  if (!ServerUp() || ServerStopped()) return;
  for (auto& serve : std::exchange(server_inbox_, {})) serve();
  for (auto& send : std::exchange(waiting_for_server_, {})) send();
  ArmServerTimer();
}

absl::StatusOr<int64_t> World::EtcdHeartbeat(int uid, const rdzv::HeartbeatRequest& request) {
  // The backend's keeper finds its lease gone (rendezvous/etcd/backend.cc).
  if (LeaseOf(uid, false) == 0) {
    return absl::NotFoundError(absl::StrCat("node ", request.node_id(), " ", rdzv::kDroppedFromJob,
                                            " '", kJob, "': its etcd lease ended"));
  }
  return EtcdOutbox(request);
}

absl::StatusOr<int64_t> World::EtcdOutbox(const rdzv::HeartbeatRequest& request) {
  const rdzv::NodeKey key{request.job_id(), request.node_id()};
  if (ServerUp() && !ServerStopped()) return hub_->Heartbeat(request);
  // What the journal says is what the last leader wrote.
  rdzv::StateOptions options;
  options.journal = true;
  options.external_liveness = true;
  options.ride_out_outages = true;
  rdzv::RendezvousState written(options);
  for (const JournalRecord& record :
       journal_ ? journal_->records() : std::vector<JournalRecord>{}) {
    written.Restore(record, Now()).IgnoreError();
  }
  return written.Heartbeat(key, request.node_secret(), Now());
}

rdzv::WatchRequest World::BeginWatch(Agent& agent, const action::OpenWatch& open) {
  agent.watch_generation = open.generation;
  agent.watch_open = true;
  auto request = Addressed<rdzv::WatchRequest>(agent.node_id, agent.secret);
  request.set_known_round(open.known_round);
  return request;
}

void World::OpenEtcdWatch(Agent& agent, const action::OpenWatch& open) {
  const rdzv::WatchRequest request = BeginWatch(agent, open);
  const int uid = agent.uid;
  const int host = agent.host;
  const uint64_t generation = open.generation;
  // In order, to the agent, over whatever connection it has then.
  auto send = [this, uid, host](std::function<void(Agent&)> deliver) {
    Agent* a = Find(uid);
    const Time at = std::max(Now() + Delay(), a->stream_at);
    a->stream_at = at;
    At(at, [this, uid, host, deliver] {
      CarryAt(host, LinkOf(host).epoch, Now(),
              [this, uid, deliver] { Post(uid, [this, uid, deliver] { deliver(*Find(uid)); }); });
    });
  };
  auto end = [this, send, generation](absl::Status status) {
    send([this, generation, status](Agent& a) {
      if (a.watch_generation != generation) return;
      a.watch_open = false;
      a.watch_attach = nullptr;
      a.watch_end = nullptr;
      Do(a, a.state.OnRdzv(rdzv_event::WatchEnded{generation, status}, Now()));
    });
  };
  Carry(host, [this, uid, request, generation, send, end] {
    if (etcd_down_) {
      end(absl::UnavailableError("etcd does not answer"));
      return;
    }
    // etcd reads the outbox at once; the leader's events follow.
    rdzv::HeartbeatRequest read =
        Addressed<rdzv::HeartbeatRequest>(request.node_id(), request.node_secret());
    absl::StatusOr<int64_t> round = EtcdOutbox(read);
    if (!round.ok()) {
      end(round.status());
      return;
    }
    rdzv::WatchEvent started;
    started.mutable_watch_started()->set_round(*round);
    send([this, generation, started](Agent& a) {
      Do(a, a.state.OnRdzv(rdzv_event::Pushed{generation, started}, Now()));
    });
    Agent* a = Find(uid);
    if (a->watch_generation != generation) return;
    a->watch_end = end;
    a->watch_attach = [this, uid, request, generation, send, end] {
      const int server_generation = server_generation_;
      rdzv::RendezvousHub::Watcher watcher;
      watcher.on_event = [this, send, generation, server_generation](const rdzv::WatchEvent& e) {
        if (dropping_ || server_generation != server_generation_ || e.has_watch_started()) return;
        send([this, generation, e](Agent& b) {
          if (e.has_job_closed() && !b.told_closed) b.told_closed = e.job_closed();
          Do(b, b.state.OnRdzv(rdzv_event::Pushed{generation, e}, Now()));
        });
      };
      // Its outbox deleted (dropped, or the job's keys gone): the watch ends.
      watcher.on_end = [this, end, server_generation](absl::Status status) {
        if (dropping_ || server_generation != server_generation_ || absl::IsCancelled(status) ||
            absl::IsAborted(status)) {
          return;
        }
        end(status);
      };
      ServerStep([this, uid, request, watcher = std::move(watcher)]() mutable {
        const uint64_t ticket = hub_->NewTicket();
        Find(uid)->watch_ticket = ticket;
        hub_->Watch(request, ticket, std::move(watcher));
      });
    };
    if (ServerUp()) a->watch_attach();
  });
}

// ---- The network ----

bool World::Cut(int host) const {
  auto it = links_.find(host);
  return it != links_.end() && it->second.cut_until.has_value();
}

bool World::LinkDown(int host) const {
  if (host == ServerHost()) return false;
  auto it = links_.find(host);
  if (it != links_.end() && it->second.rdzv_cut_until) return true;
  return Cut(host) || (ServerHost() != kMusterdHost && Cut(ServerHost()));
}

std::optional<Time> World::LinkBackAt(int host) const {
  std::optional<Time> back;
  for (int h : {host, ServerHost()}) {
    auto it = links_.find(h);
    if (it != links_.end() && it->second.cut_until)
      back = std::max(back.value_or(Now()), *it->second.cut_until);
    if (h == host && it != links_.end() && it->second.rdzv_cut_until)
      back = std::max(back.value_or(Now()), *it->second.rdzv_cut_until);
  }
  return back;
}

Duration World::Delay() {
  if (Uniform() < schedule_.network.slow)
    return Between(absl::Milliseconds(50), absl::Milliseconds(500));
  return Between(absl::Microseconds(100), absl::Milliseconds(5));
}

void World::Carry(int host, std::function<void()> deliver, std::optional<Time> at) {
  if (host == ServerHost()) {  // in-process: the agent that hosts the rendezvous
    At(Now(), std::move(deliver));
    return;
  }
  CarryAt(host, LinkOf(host).epoch, at.value_or(Now() + Delay()), std::move(deliver));
}

void World::CarryAt(int host, uint64_t epoch, Time at, std::function<void()> deliver) {
  At(at, [this, host, epoch, deliver = std::move(deliver)]() mutable {
    Link& link = LinkOf(host);
    if (link.epoch != epoch) return;  // the connection broke
    if (LinkDown(host)) {
      // TCP sends it again once the link is back.
      const Time back = std::max(Now() + absl::Seconds(1), LinkBackAt(host).value_or(Now()));
      CarryAt(host, epoch, back + Delay(), std::move(deliver));
      return;
    }
    deliver();
  });
}

void World::BreakConnection(int host, bool client_now) {
  if (host == ServerHost()) return;  // in-process: no connection to break
  Link& link = LinkOf(host);
  ++link.epoch;
  Note(absl::StrCat("connection of host ", host, " breaks"));
  for (auto& agent : agents_) {
    if (agent->host != host) continue;
    ServerForgetsAgent(*agent);
    if (!agent->alive) continue;
    if (client_now && !agent->stopped) {
      ClientLearnsBreak(*agent);
    } else {
      link.client_must_learn = true;
    }
  }
}

void World::ServerForgetsAgent(Agent& agent) {
  if (Etcd()) return;  // a node's join and watch are of etcd, not of a connection
  const uint64_t watch = std::exchange(agent.watch_ticket, 0);
  const uint64_t join = std::exchange(agent.join_ticket, 0);
  if (!ServerUp() || (watch == 0 && join == 0)) return;
  ServerStep([this, key = rdzv::NodeKey{kJob, agent.node_id}, watch, join] {
    if (watch != 0) hub_->CancelWatch(key, watch);
    if (join != 0) hub_->CancelJoin(key, join);
  });
}

void World::ClientLearnsBreak(Agent& agent) {
  LinkOf(agent.host).client_must_learn = false;
  LinkOf(agent.host).client_knows_down = LinkDown(agent.host);
  std::map<uint64_t, std::function<void(absl::Status)>> calls = std::exchange(agent.calls, {});
  for (auto& [id, fail] : calls) fail(absl::UnavailableError("connection reset"));
  // The etcd backend watches again by itself; its watch goes on.
  if (agent.watch_open && !Etcd()) {
    agent.watch_open = false;
    Post(agent.uid, [this, uid = agent.uid, generation = agent.watch_generation] {
      Agent* a = Find(uid);
      Do(*a, a->state.OnRdzv(
                 rdzv_event::WatchEnded{generation, absl::UnavailableError("connection reset")},
                 Now()));
    });
  }
}

// ---- The rendezvous ----

bool World::ServerUp() const { return hub_ != nullptr && !server_down_ && !etcd_down_; }

bool World::ServerStopped() const {
  if (Etcd()) {
    // The leader's process does not run, or does not reach etcd: nothing
    // comes in, nothing is written.
    if (!leader_) return false;
    const Agent& leader = *agents_[*leader_];
    return !leader.alive || leader.stopped || LinkDown(leader.host);
  }
  if (shape_.backend != Backend::kHost || agents_.empty()) return false;
  return agents_[0]->stopped;
}

void World::ServerStep(std::function<void()> serve) {
  if (!ServerUp()) return;
  if (ServerStopped()) {
    server_inbox_.push_back([this, serve = std::move(serve)] { ServerStep(serve); });
    return;
  }
  const int compactions = journal_ ? journal_->compactions() : 0;
  const size_t records = journal_ ? journal_->records().size() : 0;
  step_events_.clear();
  if (crash_armed_) dropping_ = true;  // it dies before anything of this step leaves
  serve();
  if (crash_armed_) {
    // Torn only if this step wrote, and did not rewrite the file.
    const bool wrote =
        journal_->records().size() != records && journal_->compactions() == compactions;
    dropping_ = false;
    CrashServer(wrote ? *crash_armed_ : 1, crash_down_);
    return;
  }
  for (const rdzv::JobEvent& event : step_events_) {
    if (event.kind() == rdzv::JobEvent::JOB_FORGOTTEN) {
      // A node that joins now starts a new job under the same id.
      Note("job forgotten");
      ++job_incarnation_;
      max_restart_seen_ = 0;
      failures_injected_ = 0;
      closed_.reset();
    }
    if (event.kind() == rdzv::JobEvent::JOB_CLOSED) closed_ = event;
    if (event.kind() == rdzv::JobEvent::JOB_CLOSED) {
      Note(absl::StrCat("job closed: ", event.succeeded() ? "succeeded" : "failed", ": ",
                        event.detail()));
    }
  }
  if (journal_ &&
      (journal_->records().size() != records || journal_->compactions() != compactions)) {
    CheckJournal();
  }
  ArmServerTimer();
}

void World::Serve(int host, std::function<void()> serve) {
  const uint64_t epoch = LinkOf(host).epoch;
  ServerStep([this, host, epoch, serve = std::move(serve)] {
    // Held while the server's process was stopped: a request whose
    // connection broke meanwhile is read, then cancelled: as never served.
    // In etcd it is a key, read by whichever leader comes.
    if (host == ServerHost() || LinkOf(host).epoch == epoch || Etcd()) serve();
  });
}

void World::ArmServerTimer() {
  if (!ServerUp()) return;
  std::optional<Time> next = hub_->NextDeadline();
  if (!next || (server_timer_at_ && *server_timer_at_ <= *next && *server_timer_at_ >= Now())) {
    return;
  }
  server_timer_at_ = *next;
  const int generation = server_generation_;
  At(*next, [this, generation] {
    if (generation != server_generation_ || !ServerUp()) return;
    server_timer_at_.reset();
    if (ServerStopped()) return;  // its process runs its timers when it resumes
    ServerStep([this] { hub_->RunDueTimers(); });
    ArmServerTimer();
  });
}

void World::CheckJournal() {
  // A state restored from the journal equals the state that wrote it.
  rdzv::StateOptions state;
  state.journal = true;
  rdzv::RendezvousState restored(state);
  for (const JournalRecord& record : journal_->records()) {
    if (absl::Status status = restored.Restore(record, Now()); !status.ok()) {
      Violation(absl::StrCat("the journal does not restore: ", status.message()));
      return;
    }
  }
  std::vector<JournalRecord> want = hub_->Snapshot();
  std::vector<JournalRecord> got = restored.Snapshot();
  // Joins are not journaled: a pending join is made again after a restart.
  // So neither is the count of joins, nor when a member last joined
  // (join_seq: the order of nodes on one host, for the next round).
  for (auto* records : {&want, &got}) {
    for (JournalRecord& record : *records) {
      if (!record.has_round_formed()) continue;
      record.mutable_round_formed()->clear_next_join_seq();
      for (auto& member : *record.mutable_round_formed()->mutable_members()) {
        member.clear_join_seq();
      }
    }
  }
  for (size_t i = 0; i < std::max(want.size(), got.size()); ++i) {
    const std::string wrote = i < want.size() ? want[i].ShortDebugString() : "(none)";
    const std::string read = i < got.size() ? got[i].ShortDebugString() : "(none)";
    if (wrote == read) continue;
    Violation(
        absl::StrCat("the state restored from the journal differs from the state that "
                     "wrote it: record ",
                     i, " is {", read, "}, not {", wrote, "}"));
    return;
  }
}

template <typename R>
void World::Call(Agent& agent, Duration timeout, bool wait_for_ready,
                 std::function<void(std::function<void(R)>)> serve,
                 std::function<void(Agent&, R)> done, By by, std::function<void()> Agent::*replay) {
  const uint64_t id = ++next_call_;
  const int uid = agent.uid;
  const int host = agent.host;
  auto finished = std::make_shared<bool>(false);
  auto finish = [this, uid, id, finished, done](R result) {
    if (*finished) return;
    *finished = true;
    Agent* a = Find(uid);
    a->calls.erase(id);
    if (!a->alive) return;
    Post(uid, [this, uid, done, result = std::move(result)] { done(*Find(uid), result); });
  };
  agent.calls[id] = [finish](absl::Status status) { finish(R(std::move(status))); };
  At(Now() + timeout, [finish] { finish(R(absl::DeadlineExceededError("Deadline Exceeded"))); });
  if (!wait_for_ready && host != ServerHost() && LinkOf(host).client_knows_down) {
    // The channel knows it has no connection: the call fails at once.
    At(Now() + absl::Milliseconds(1),
       [finish] { finish(R(absl::UnavailableError("no connection"))); });
    return;
  }
  // The server serves the call; its answer goes back on the connection,
  // unless the server that served it is gone by then.
  // `lease`: the etcd lease the request's key was written under.
  auto served = [this, uid, host, serve, finish](int64_t lease) {
    Serve(host, [this, uid, host, serve, finish, lease] {
      // A key under a lease that ended is gone: no leader reads it.
      if (Etcd() && (lease == 0 || LeaseOf(uid, false) != lease)) return;
      const int generation = server_generation_;
      serve([this, host, finish, generation](R result) {
        if (dropping_ || generation != server_generation_) return;
        Carry(host, [finish, result = std::move(result)] { finish(result); });
      });
    });
  };
  auto arrive = [this, uid, host, served, serve, finish, wait_for_ready, by, replay] {
    const int64_t lease = Etcd() ? LeaseOf(uid, by == By::kRendezvous) : 0;
    if (replay != nullptr) Find(uid)->*replay = [served, lease] { served(lease); };
    if (by == By::kEtcd) {
      if (etcd_down_) {
        Carry(host, [finish] { finish(R(absl::UnavailableError("etcd does not answer"))); });
        return;
      }
      serve([this, host, finish](R result) {
        Carry(host, [finish, result = std::move(result)] { finish(result); });
      });
      return;
    }
    if (ServerUp()) {
      served(lease);
    } else if (wait_for_ready) {
      // Connection refused: a call that waits for the server is sent once
      // it is up (until its deadline).
      waiting_for_server_.push_back([this, host, served, lease] {
        Carry(host, [this, served, lease] {
          if (ServerUp()) served(lease);
        });
      });
    } else {
      Carry(host, [finish] { finish(R(absl::UnavailableError("connection refused"))); });
    }
  };
  Carry(host, arrive);
  // A key written twice in etcd is one key (the leader reads a join's seq once).
  if (host != ServerHost() && Uniform() < schedule_.network.duplicate && !Etcd()) {
    Carry(host, arrive);
  }
  if (host != ServerHost() && Uniform() < schedule_.network.loss) {
    // The connection resets under the call, which the server may or may not
    // have served: both ends see it, and every call and watch on it ends.
    At(Now() + Delay(), [this, host] {
      if (!LinkDown(host)) BreakConnection(host, true);
    });
  }
}

// ---- The agents ----

void World::Post(int uid, std::function<void()> event) {
  At(Now(), [this, uid, event = std::move(event)] {
    Agent* agent = Find(uid);
    if (!agent->alive || agent->state.done()) return;
    if (agent->stopped) {
      agent->inbox.push_back(event);
      return;
    }
    event();
    ArmAgentTimer(*agent);
  });
}

void World::ArmAgentTimer(Agent& agent) {
  if (!agent.alive || agent.state.done()) return;
  std::optional<Time> next = agent.state.NextDeadline();
  if (!next || (agent.timer_at && *agent.timer_at == *next)) return;
  agent.timer_at = next;
  const uint64_t generation = ++agent.timer_generation;
  At(*next, [this, uid = agent.uid, generation] {
    Agent* a = Find(uid);
    if (a->timer_generation != generation || !a->alive) return;
    a->timer_at.reset();
    Post(uid, [this, uid] {
      Agent* b = Find(uid);
      Do(*b, b->state.OnTimer(Now()));
    });
  });
}

void World::Do(Agent& agent, Actions actions) {
  for (Action& action : actions) {
    if (!agent.alive) return;
    DoOne(agent, action);
  }
}

void World::DoOne(Agent& agent, Action& action) {
  std::visit([this, &agent](auto& a) { Perform(agent, a); }, action);
}

void World::Perform(Agent& agent, const action::Join& join) { SendJoin(agent, join); }
void World::Perform(Agent& agent, const action::StartWorkers& start) { StartWorkers(agent, start); }
void World::Perform(Agent& agent, const action::SignalWorkers& signal) {
  SignalWorkers(agent, signal.sig);
}
void World::Perform(Agent& agent, const action::OpenWatch& open) { OpenWatch(agent, open); }
void World::Perform(Agent& agent, const action::AskPeers& ask) { AskPeers(agent, ask); }
void World::Perform(Agent& agent, const action::Exit& exit) { AgentExits(agent, exit); }

void World::Perform(Agent& agent, const action::AbandonWorkers&) {
  Violation(absl::StrCat(agent.node_id, " abandoned workers that SIGKILL did not end"));
}

void World::Perform(Agent& agent, const action::ReportFailure& report) {
  auto request = Addressed<rdzv::ReportFailureRequest>(agent.node_id, agent.secret);
  request.set_round(report.round);
  request.mutable_failure()->set_rank(report.failure.rank);
  request.mutable_failure()->set_host(report.failure.host);
  request.mutable_failure()->set_exit_code(report.failure.exit_code);
  request.mutable_failure()->set_signal(report.failure.signal);
  Call<absl::Status>(
      agent, kRpcTimeout, true,
      [this, request](std::function<void(absl::Status)> reply) {
        reply(hub_->ReportFailure(request));
      },
      [this](Agent& a, absl::Status status) {
        Do(a, a.state.OnRdzv(rdzv_event::FailureReported{std::move(status)}, Now()));
      });
}

void World::Perform(Agent& agent, const action::ReportDone& done) {
  auto request = Addressed<rdzv::ReportDoneRequest>(agent.node_id, agent.secret);
  request.set_round(done.round);
  Call<absl::Status>(
      agent, kRpcTimeout, true,
      [this, request](std::function<void(absl::Status)> reply) {
        reply(hub_->ReportDone(request));
      },
      [this](Agent& a, absl::Status status) {
        NoteClosed(a, status);
        Do(a, a.state.OnRdzv(rdzv_event::DoneReported{std::move(status)}, Now()));
      });
}

void World::Perform(Agent& agent, const action::SendHeartbeat& beat) {
  auto request = Addressed<rdzv::HeartbeatRequest>(agent.node_id, agent.secret);
  Call<absl::StatusOr<int64_t>>(
      agent, kRpcTimeout, false,
      [this, request, uid = agent.uid](std::function<void(absl::StatusOr<int64_t>)> reply) {
        reply(Etcd() ? EtcdHeartbeat(uid, request) : hub_->Heartbeat(request));
      },
      [this, seq = beat.seq](Agent& a, absl::StatusOr<int64_t> round) {
        NoteClosed(a, round.status());
        Do(a, a.state.OnRdzv(rdzv_event::HeartbeatAnswered{std::move(round), seq}, Now()));
      },
      Etcd() ? By::kEtcd : By::kRendezvous);
}

void World::Perform(Agent& agent, const action::QueryStatus&) {
  Call<absl::StatusOr<rdzv::StatusResponse>>(
      agent, kRpcTimeout, false,
      [this](std::function<void(absl::StatusOr<rdzv::StatusResponse>)> reply) {
        reply(hub_->Status(kJob));
      },
      [this](Agent& a, absl::StatusOr<rdzv::StatusResponse> status) {
        Do(a, a.state.OnRdzv(rdzv_event::JobStatusAnswered{std::move(status)}, Now()));
      });
}

void World::Perform(Agent& agent, const action::Log& log) {
  if (options_.trace && log.level >= action::Log::Level::kInfo) {
    Note(absl::StrCat(agent.node_id, ": ", log.text));
  }
}

// No GPUs and no progress files here (ElasticOptions turns them off).
void World::Perform(Agent& agent, const action::ReadProgress&) { Unmodelled(agent); }
void World::Perform(Agent& agent, const action::CheckHealth&) { Unmodelled(agent); }
void World::Perform(Agent& agent, const action::ExcludeSelf&) { Unmodelled(agent); }
void World::Unmodelled(Agent& agent) {
  Violation(absl::StrCat(agent.node_id, " asked for what this simulation does not model"));
}

void World::NoteClosed(Agent& agent, const absl::Status& status) {
  // A refused call says how the job closed (rdzv::ClosedJob).
  if (!absl::IsFailedPrecondition(status) || agent.told_closed) return;
  if (rdzv::ClosedJobSucceeded(status.message())) {
    rdzv::JobClosed closed;
    closed.set_succeeded(true);
    agent.told_closed = closed;
  }
}

void World::SendJoin(Agent& agent, const action::Join& join) {
  rdzv::JoinRequest request;
  request.set_job_id(kJob);
  rdzv::JobConfig* config = request.mutable_config();
  config->set_min_nodes(shape_.min_nodes);
  config->set_max_nodes(shape_.max_nodes);
  config->set_max_restarts(shape_.max_restarts);
  config->set_last_call_timeout_ms(absl::ToInt64Milliseconds(shape_.last_call_timeout));
  config->set_join_timeout_ms(absl::ToInt64Milliseconds(shape_.join_timeout));
  config->set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(shape_.heartbeat_timeout));
  rdzv::NodeInfo* node = request.mutable_node();
  node->set_node_id(agent.node_id);
  node->set_host(absl::StrCat("h", agent.host));
  node->set_advertised_addr(absl::StrCat("10.0.0.", agent.host + 1));
  node->set_local_world_size(shape_.nproc);
  node->set_node_rank_hint(-1);
  node->set_master_port_candidate(29500 + agent.host);
  node->set_peer_port(29600 + agent.host);
  node->set_stop_allowance_ms(
      absl::ToInt64Milliseconds(ElasticState::StopAllowance(shape_.shutdown_grace)));
  request.set_node_secret(agent.secret);
  request.set_join_key(absl::StrCat("key-", agent.node_id));  // one per agent process
  request.set_protocol_version(rdzv::kProtocolVersion);
  const int uid = agent.uid;
  const uint64_t call = ++agent.joins_sent;
  // Joining again after its workers succeeded: the job moved on as they
  // finished (a spare joined first), and what they did is superseded.
  agent.succeeded_round = -1;
  // At its deadline the agent cancels the call: the server hears of it
  // after the request (RST_STREAM), and cancels the join if still pending.
  At(Now() + join.timeout + kJoinSlack, [this, uid, call] {
    Agent* a = Find(uid);
    if (!a->alive) return;
    Carry(a->host, [this, uid, call] {
      Agent* b = Find(uid);
      if (b->join_at_server != call || b->join_ticket == 0 || !ServerUp()) return;
      const uint64_t ticket = std::exchange(b->join_ticket, 0);
      ServerStep(
          [this, key = rdzv::NodeKey{kJob, b->node_id}, ticket] { hub_->CancelJoin(key, ticket); });
    });
  });
  Call<absl::StatusOr<Assignment>>(
      agent, join.timeout + kJoinSlack, true,
      [this, request, uid, call](std::function<void(absl::StatusOr<Assignment>)> reply) {
        const uint64_t ticket = hub_->NewTicket();
        Find(uid)->join_ticket = ticket;
        Find(uid)->join_at_server = call;
        hub_->Join(request, absl::StrCat("10.0.0.", Find(uid)->host + 1), ticket,
                   [this, uid, ticket, reply](absl::StatusOr<Assignment> assignment) {
                     // Answered: no longer pending there.
                     if (Find(uid)->join_ticket == ticket) Find(uid)->join_ticket = 0;
                     reply(std::move(assignment));
                   });
      },
      [this](Agent& a, absl::StatusOr<Assignment> assignment) {
        if (assignment.ok()) a.secret = assignment->node_secret();
        NoteClosed(a, assignment.status());
        Do(a, a.state.OnRdzv(rdzv_event::Joined{std::move(assignment)}, Now()));
      },
      By::kRendezvous, &Agent::join_replay);
}

void World::OpenWatch(Agent& agent, const action::OpenWatch& open) {
  if (Etcd()) {
    OpenEtcdWatch(agent, open);
    return;
  }
  const rdzv::WatchRequest request = BeginWatch(agent, open);
  const int uid = agent.uid;
  const int host = agent.host;
  const uint64_t generation = open.generation;
  auto refused = [this, uid, generation] {
    // A watch does not wait for the server (no wait_for_ready): it fails at once.
    Post(uid, [this, uid, generation] {
      Agent* a = Find(uid);
      if (a->watch_generation == generation) a->watch_open = false;
      Do(*a, a->state.OnRdzv(
                 rdzv_event::WatchEnded{generation, absl::UnavailableError("connection refused")},
                 Now()));
    });
  };
  if (host != ServerHost() && LinkOf(host).client_knows_down) {
    At(Now() + absl::Milliseconds(1), refused);
    return;
  }
  Carry(host, [this, uid, host, generation, request, refused] {
    if (!ServerUp()) {
      Carry(host, refused);
      return;
    }
    const int server_generation = server_generation_;
    const uint64_t epoch = LinkOf(host).epoch;
    // Events leave in order on the stream; nothing leaves once it broke.
    auto send = [this, uid, host, epoch, server_generation](std::function<void(Agent&)> deliver) {
      if (dropping_ || server_generation != server_generation_) return;
      Agent* a = Find(uid);
      const Time at = std::max(Now() + Delay(), a->stream_at);
      a->stream_at = at;
      if (host == ServerHost()) {
        At(at, [this, uid, deliver] { Post(uid, [this, uid, deliver] { deliver(*Find(uid)); }); });
        return;
      }
      CarryAt(host, epoch, at,
              [this, uid, deliver] { Post(uid, [this, uid, deliver] { deliver(*Find(uid)); }); });
    };
    rdzv::RendezvousHub::Watcher watcher;
    watcher.on_event = [this, send, generation](const rdzv::WatchEvent& event) {
      send([this, generation, event](Agent& a) {
        if (event.has_job_closed() && !a.told_closed) a.told_closed = event.job_closed();
        Do(a, a.state.OnRdzv(rdzv_event::Pushed{generation, event}, Now()));
      });
    };
    watcher.on_end = [this, send, generation](absl::Status status) {
      send([this, generation, status](Agent& a) {
        if (a.watch_generation == generation) a.watch_open = false;
        Do(a, a.state.OnRdzv(rdzv_event::WatchEnded{generation, status}, Now()));
      });
    };
    Serve(host, [this, uid, request, watcher = std::move(watcher)]() mutable {
      const uint64_t ticket = hub_->NewTicket();
      Find(uid)->watch_ticket = ticket;
      hub_->Watch(request, ticket, std::move(watcher));
    });
  });
}

void World::AskPeers(Agent& agent, const action::AskPeers& ask) {
  auto answers = std::make_shared<std::vector<PeerAnswer>>();
  const int host = agent.host;
  // The peers its assignment named (as agent.cc asks them): their uids.
  std::vector<int> peers;
  if (agent.peers_round == ask.round) {
    for (const std::string& id : agent.peers) {
      auto it = std::find_if(agents_.begin(), agents_.end(),
                             [&id](const auto& other) { return other->node_id == id; });
      if (it == agents_.end()) Violation(absl::StrCat("peer ", id, " is no agent"));
      if (it != agents_.end()) peers.push_back((*it)->uid);
    }
  }
  for (const int uid : peers) {
    const size_t slot = answers->size();
    answers->push_back(PeerAnswer{.node = absl::StrCat("h", Find(uid)->host)});
    if (!PeerLinkUp(host, Find(uid)->host)) continue;
    At(Now() + Delay(), [this, uid, host, slot, answers, round = ask.round] {
      Agent* peer = Find(uid);
      if (!peer->alive || peer->stopped || !PeerLinkUp(host, peer->host)) return;
      const auto& kept = peer->rounds_kept;
      if (std::find(kept.begin(), kept.end(), round) == kept.end()) return;  // no key for it
      PeerAnswer answer = peer->state.AnswerPeer();
      answer.node = (*answers)[slot].node;
      At(Now() + Delay(), [this, uid, host, slot, answers, answer] {
        if (PeerLinkUp(host, Find(uid)->host)) (*answers)[slot] = answer;
      });
    });
  }
  At(Now() + ask.timeout, [this, uid = agent.uid, round = ask.round, answers] {
    Post(uid, [this, uid, round, got = *answers] {
      Agent* a = Find(uid);
      Do(*a, a->state.OnPeersAnswered(round, got, Now()));
    });
  });
}

void World::StartWorkers(Agent& agent, const action::StartWorkers& start) {
  const Assignment& assignment = start.assignment;
  CheckAssignment(agent, assignment);
  agent.peers.clear();
  for (const rdzv::Peer& peer : assignment.peers()) agent.peers.push_back(peer.node_id());
  agent.peers_round = assignment.round();
  agent.rounds_kept.push_back(assignment.round());
  if (agent.rounds_kept.size() > PeerEndpoint::kKeptRounds) agent.rounds_kept.pop_front();
  const int64_t key = RoundKey(assignment.round());
  RoundSeen& round = rounds_[key];
  agent.succeeded_round = -1;  // a newer round: what it finished before is superseded
  for (int local = 0; local < shape_.nproc; ++local) {
    agent.workers.push_back(Worker{assignment.rank_base() + local, local, key, next_pid_++, true});
  }
  round.started_ranks += shape_.nproc;
  round.live_ranks += shape_.nproc;
  Note(absl::StrCat(agent.node_id, " starts round ", assignment.round(), " ranks ",
                    assignment.rank_base(), "+", shape_.nproc, " of ", assignment.world_size(),
                    ", restarts ", assignment.restart_count()));
  // Every rank runs: the round trains, and succeeds unless a rank stops first.
  if (round.started_ranks == round.world_size && !round.broken) {
    At(Now() + shape_.work, [this, key] { CheckRoundSucceeds(key); });
  }
  Do(agent, agent.state.OnWorkersStarted(shape_.nproc, std::nullopt, Now()));
}

void World::CheckRoundSucceeds(int64_t number) {
  RoundSeen& round = rounds_[number];
  if (round.broken || round.live_ranks != round.world_size) return;
  round.succeeded = true;
  Note(absl::StrCat("round ", number, " trained to the end"));
  for (auto& agent : agents_) {
    if (!agent->alive) continue;
    // A worker being stopped may still finish: that is no success of its node's.
    const bool running = agent->state.phase() == AgentPhase::kRunning;
    bool all = false;
    for (Worker& worker : agent->workers) {
      if (!worker.alive || worker.round != number) continue;
      WorkerExited(*agent, worker.pid, ExitStatus{0, 0});
      all = true;
    }
    if (all && running) agent->succeeded_round = number;
  }
}

void World::SignalWorkers(Agent& agent, int sig) {
  if (sig != SIGTERM && sig != SIGKILL) return;
  for (const Worker& worker : agent.workers) {
    if (!worker.alive) continue;
    Duration after = Between(absl::Milliseconds(1), absl::Milliseconds(50));
    if (sig == SIGTERM && Uniform() < kSlowStopShare) {
      after = Between(absl::ZeroDuration(), 2 * shape_.shutdown_grace);  // may need SIGKILL
    } else if (sig == SIGTERM) {
      after = Between(absl::Milliseconds(10), absl::Milliseconds(500));
    }
    At(Now() + after, [this, uid = agent.uid, pid = worker.pid, sig] {
      Agent* a = Find(uid);
      if (a->alive) WorkerExited(*a, pid, ExitStatus{0, sig});
    });
  }
}

void World::WorkerExited(Agent& agent, int pid, ExitStatus status) {
  auto it = std::find_if(agent.workers.begin(), agent.workers.end(),
                         [pid](const Worker& w) { return w.pid == pid; });
  if (it == agent.workers.end() || !it->alive) return;
  it->alive = false;
  RoundSeen& round = rounds_[it->round];
  --round.live_ranks;
  if (!status.success() && !round.succeeded) round.broken = true;
  WorkerFailure failure;
  failure.rank = it->rank;
  failure.local_rank = it->local_rank;
  failure.host = absl::StrCat("h", agent.host);
  failure.pid = pid;
  failure.exit_code = status.exit_code;
  failure.signal = status.signal;
  failure.time = Now();
  Post(agent.uid, [this, uid = agent.uid, status, failure] {
    Agent* a = Find(uid);
    Do(*a, a->state.OnWorkerExit(status, failure, Now()));
  });
}

void World::AgentExits(Agent& agent, const action::Exit& exit) {
  Note(absl::StrCat(agent.node_id, " exits ", exit.code, exit.why.empty() ? "" : ": ", exit.why));
  CheckExit(agent, exit.code);
  agent.exit_code = exit.code;
  if (exit.leave_reason) {
    auto request = Addressed<rdzv::LeaveRequest>(agent.node_id, agent.secret);
    request.set_reason(*exit.leave_reason);
    Call<absl::Status>(
        agent, kLeaveTimeout, false,
        [this, request](std::function<void(absl::Status)> reply) { reply(hub_->Leave(request)); },
        [](Agent&, absl::Status) {});
  }
  // The process ends: its connections close after what it sent.
  agent.alive = false;
  const int host = agent.host;
  // The etcd backend revokes its lease as it shuts down: a leader hands over at once.
  if (Etcd() && leases_.contains(agent.uid) && !LinkDown(host) && !etcd_down_) {
    At(Now() + absl::Milliseconds(20), [this, uid = agent.uid] {
      if (leases_.contains(uid)) LeaseEnds(*Find(uid));
    });
  }
  if (shape_.backend == Backend::kHost && host == 0) {
    At(Now() + absl::Milliseconds(20), [this] { HostedServerDies(); });
    return;
  }
  // Its kernel closes the connection after what it sent (held while the link is cut).
  Carry(host, [this, host] { BreakConnection(host, false); });
}

// ---- The checker ----

void World::CheckPeers(const Agent& agent, const Assignment& a, const RoundSeen& round) {
  const std::string where = absl::StrCat("round ", a.round(), " (", agent.node_id, "): ");
  if (a.peer_key() != round.peer_key) {
    Violation(absl::StrCat(where, "its peer key differs from another member's"));
  }
  if (!a.ride_out_outages()) {
    if (!a.peer_key().empty() || a.peers_size() > 0) {
      Violation(absl::StrCat(where, "peers named where no outage is ridden out"));
    }
    return;
  }
  if (a.peer_key().size() != 32) Violation(absl::StrCat(where, "no 32-byte peer key"));
  if (a.peers_size() != std::min(rdzv::kMaxPeers, a.group_world_size() - 1)) {
    Violation(
        absl::StrCat(where, a.peers_size(), " peers named in a round of ", a.group_world_size()));
  }
  std::set<std::string> named;
  for (const rdzv::Peer& peer : a.peers()) {
    if (peer.node_id() == agent.node_id || !named.insert(peer.node_id()).second) {
      Violation(absl::StrCat(where, "peer ", peer.node_id(), " named twice, or itself"));
    }
  }
}

void World::CheckAssignment(const Agent& agent, const Assignment& a) {
  const int64_t key = RoundKey(a.round());
  RoundSeen& round = rounds_[key];
  const std::string master = absl::StrCat(a.master_addr(), ":", a.master_port());
  const std::string where = absl::StrCat("round ", a.round(), " (", agent.node_id, "): ");
  if (round.world_size == 0) {
    round.world_size = a.world_size();
    round.restart_count = a.restart_count();
    round.group_world_size = a.group_world_size();
    round.master = master;
    round.peer_key = a.peer_key();
    if (a.restart_count() < max_restart_seen_) {
      Violation(absl::StrCat(where, "restart count went back from ", max_restart_seen_, " to ",
                             a.restart_count()));
    }
    max_restart_seen_ = std::max(max_restart_seen_, a.restart_count());
  } else if (round.world_size != a.world_size() || round.restart_count != a.restart_count() ||
             round.group_world_size != a.group_world_size() || round.master != master) {
    Violation(absl::StrCat(where, "members disagree: world ", a.world_size(), " vs ",
                           round.world_size, ", restarts ", a.restart_count(), " vs ",
                           round.restart_count, ", master ", master, " vs ", round.master));
  }
  CheckPeers(agent, a, round);
  if (a.restart_count() > shape_.max_restarts) {
    Violation(absl::StrCat(where, "restart count ", a.restart_count(), " is past max_restarts ",
                           shape_.max_restarts));
  }
  if (a.restart_count() > failures_injected_) {
    Violation(absl::StrCat(where, "restart count ", a.restart_count(), " but only ",
                           failures_injected_, " worker failure(s) happened"));
  }
  if (auto [it, fresh] = round.group_ranks.emplace(a.group_rank(), agent.uid);
      !fresh && it->second != agent.uid) {
    Violation(absl::StrCat(where, "group rank ", a.group_rank(), " given twice"));
  }
  const int begin = a.rank_base();
  const int end = begin + shape_.nproc;
  if (begin < 0 || end > a.world_size()) {
    Violation(absl::StrCat(where, "ranks ", begin, "..", end - 1, " outside the world"));
  }
  for (const auto& [b, e] : round.rank_spans) {
    if (begin < e && b < end) {
      Violation(absl::StrCat(where, "ranks ", begin, "..", end - 1, " given twice"));
    }
  }
  round.rank_spans.emplace_back(begin, end);
  // Older rounds' workers on these seats: they must stop within the bound.
  for (auto& other : agents_) {
    if (!other->alive) continue;
    for (const Worker& worker : other->workers) {
      if (worker.alive && worker.round < key && worker.rank >= begin && worker.rank < end) {
        overlap_since_.emplace(std::make_pair(other->uid, worker.round), Now());
        overlap_stopped_at_.emplace(std::make_pair(other->uid, worker.round), other->stopped_total);
      }
    }
  }
}

void World::CheckExit(const Agent& agent, int code) {
  for (const Worker& worker : agent.workers) {
    if (worker.alive) {
      Violation(absl::StrCat(agent.node_id, " exits ", code, " leaving worker pid ", worker.pid,
                             " (round ", worker.round, ") running"));
      break;
    }
  }
  const bool succeeded = closed_ && closed_->succeeded();
  // An agent whose workers all succeeded exits 0 once the rendezvous knows
  // (torchrun's rule); else only when told the job succeeded.
  if (code == kExitSuccess && agent.succeeded_round < 0 &&
      !(agent.told_closed && agent.told_closed->succeeded())) {
    Violation(absl::StrCat(agent.node_id,
                           " exits 0, but its workers did not succeed and it was "
                           "not told that the job did"));
  }
  if (agent.succeeded_round >= 0 && !agent.signaled && code != kExitSuccess && succeeded) {
    Violation(absl::StrCat(agent.node_id, " trained round ", agent.succeeded_round,
                           " to the end, the job succeeded, and it exits ", code));
  }
  if (agent.told_closed && !agent.told_closed->succeeded() && !agent.signaled &&
      code != kExitWorkersFailed) {
    Violation(absl::StrCat(agent.node_id, " was told the job failed and exits ", code));
  }
}

Duration World::SplitBrainBound(int64_t round) const {
  // docs/multi-node.md: the workers of a node cut off from the rendezvous
  // and from its round stop within twice its keepalive (to find the
  // connection dead), 1 s (to ask its peers), shutdown_grace and 1 s of a
  // newer round starting on their seats; those of a node alone in its
  // round, which has no peer to ask, within heartbeat_timeout more.
  // In host mode a node does not ride out: it gives up once
  // keep_alive_max_attempt heartbeats in a row went unanswered (each within
  // its 10 s deadline).
  const RoundSeen& seen = rounds_.at(round);
  const Duration find = 2 * ClientKeepalive() + shape_.shutdown_grace + absl::Seconds(1);
  if (shape_.backend == Backend::kHost) {
    return find + kRpcTimeout + shape_.keep_alive_interval * shape_.keep_alive_max_attempt;
  }
  return find + ElasticState::kPeerTimeout +
         (seen.group_world_size == 1 ? shape_.heartbeat_timeout : absl::ZeroDuration());
}

Duration World::ClientKeepalive() const {
  // launcher/run.cc's ClientKeepalive, at least kMinClientKeepaliveInterval.
  return std::max(absl::Seconds(1),
                  std::min(shape_.keep_alive_interval * shape_.keep_alive_max_attempt,
                           shape_.heartbeat_timeout / 3));
}

Duration World::LivenessBound() const {
  return 2 * shape_.heartbeat_timeout + 2 * shape_.join_timeout + shape_.work +
         2 * shape_.shutdown_grace + ElasticState::kKillWait + kRpcTimeout + absl::Seconds(60);
}

bool World::RoundCutOff(int64_t round) const {
  if (shape_.backend == Backend::kHost) return false;
  // Alone, a node cut off learns from its peers (or from their silence)
  // that it must stop; only two or more may tell each other "same round".
  int runners = 0;
  for (const auto& agent : agents_) {
    if (!agent->RunsRound(round)) continue;
    if (!LinkDown(agent->host)) return false;
    ++runners;
  }
  return runners >= 2;
}

void World::CheckSplitBrain() {
  for (auto it = overlap_since_.begin(); it != overlap_since_.end();) {
    const auto [uid, round] = it->first;
    Agent* agent = Find(uid);
    if (!agent->RunsRound(round)) {
      overlap_stopped_at_.erase(it->first);
      it = overlap_since_.erase(it);
      continue;
    }
    if (RoundCutOff(round)) {
      // Every node still running the round is cut off from the rendezvous,
      // which seated others meanwhile: none of them can tell this from an
      // outage of the rendezvous, and all ride it out (docs/multi-node.md
      // says so). The bound counts from when one of them reaches it again.
      it->second = Now();
      overlap_stopped_at_[it->first] = agent->stopped_total;
      ++it;
      continue;
    }
    Duration stopped = agent->stopped_total - overlap_stopped_at_[it->first];
    if (agent->stopped) stopped += Now() - agent->stopped_since;
    if (Now() - it->second - stopped > SplitBrainBound(round)) {
      Violation(absl::StrCat(agent->node_id, "'s workers of round ", round, " still run ",
                             Seconds(Now() - it->second),
                             " after a newer round started on their seats"));
      overlap_stopped_at_.erase(it->first);
      it = overlap_since_.erase(it);
      continue;
    }
    ++it;
  }
}

void World::CheckEnd() {
  for (auto& agent : agents_) {
    if (agent->alive && !agent->state.done()) {
      Violation(absl::StrCat("liveness: ", agent->node_id, " has not exited ",
                             Seconds(Now() - last_fault_end_), " after the last fault"));
    }
    for (const Worker& worker : agent->workers) {
      if (worker.alive && agent->alive) {
        Violation(absl::StrCat(agent->node_id, "'s worker pid ", worker.pid, " is left running"));
      }
    }
  }
}

Outcome World::Run() {
  if (shape_.backend == Backend::kMusterd) StartServer();
  if (Etcd()) At(kEpoch + kLeaseTick, [this] { TickLeases(); });
  for (int host = 0; host < shape_.nodes; ++host) {
    if (shape_.backend == Backend::kHost && host == 0) {
      StartServer();
      StartAgent(0);
      continue;
    }
    At(kEpoch + absl::Milliseconds(host * 37), [this, host] { StartAgent(host); });
  }
  for (const Fault& fault : schedule_.faults) {
    At(kEpoch + fault.at, [this, fault] { Inject(fault); });
    last_fault_end_ = std::max(last_fault_end_, kEpoch + fault.at + fault.length);
  }
  const Time limit = last_fault_end_ + LivenessBound();
  Time next_check = kEpoch;
  while (!queue_.empty()) {
    std::pop_heap(queue_.begin(), queue_.end(), [](const Step& a, const Step& b) {
      return a.at != b.at ? a.at > b.at : a.seq > b.seq;
    });
    Step step = std::move(queue_.back());
    queue_.pop_back();
    if (step.at > limit) break;
    if (outcome_.steps >= kMaxSteps) {
      Violation(absl::StrCat(
          "runaway: ", kMaxSteps, " steps by ", Seconds(Now() - kEpoch), " (the last: ",
          options_.trace && !outcome_.trace.empty() ? outcome_.trace.back() : "run with --trace",
          ")"));
      break;
    }
    if (step.at > Now()) clock_.Advance(step.at - Now());
    ++outcome_.steps;
    step.run();
    if (Now() >= next_check) {
      CheckSplitBrain();
      next_check = Now() + absl::Milliseconds(250);
    }
    const bool all_done = std::all_of(agents_.begin(), agents_.end(),
                                      [](const auto& a) { return !a->alive || a->state.done(); });
    if (all_done && Now() > last_fault_end_) break;
  }
  CheckEnd();
  outcome_.ended_at = Now() - kEpoch;
  outcome_.ending =
      closed_ ? absl::StrCat(closed_->succeeded() ? "succeeded" : "failed", ": ", closed_->detail())
              : "not closed";
  Note(absl::StrCat("end: ", outcome_.ending));
  return std::move(outcome_);
}

}  // namespace

std::string Describe(const Fault& fault) {
  const std::string at = Seconds(fault.at);
  const std::string length = absl::StrFormat("%.1f s", absl::ToDoubleSeconds(fault.length));
  switch (fault.kind) {
    case FaultKind::kWorkerFails:
      return absl::StrCat(at, ": a worker on host ", fault.host, " fails");
    case FaultKind::kAgentKilled:
      return absl::StrCat(
          at, ": agent on host ", fault.host, " killed",
          fault.length > absl::ZeroDuration() ? absl::StrCat(", restarted after ", length) : "");
    case FaultKind::kAgentStopped:
      return absl::StrCat(at, ": agent on host ", fault.host, " stopped for ", length);
    case FaultKind::kAgentLeaves:
      return absl::StrCat(at, ": agent on host ", fault.host, " gets SIGTERM");
    case FaultKind::kSpareJoins: return absl::StrCat(at, ": a spare starts on host ", fault.host);
    case FaultKind::kLinkCut:
      return absl::StrCat(at, ": link of host ", fault.host, " cut for ", length);
    case FaultKind::kRdzvCut:
      return absl::StrCat(at, ": route of host ", fault.host, " to the rendezvous cut for ",
                          length);
    case FaultKind::kServerCrash:
      return absl::StrCat(
          at, ": the rendezvous server crashes (musterd: ", static_cast<int>(fault.torn * 100),
          "% of its last write kept; etcd: the whole cluster), back after ", length);
  }
  return at;
}

std::string Describe(const Schedule& schedule) {
  const JobShape& s = schedule.shape;
  std::string text = absl::StrFormat(
      "seed %d: %s, %d node(s) x %d, --nnodes %d:%d, --max-restarts %d, heartbeat %.0f s, join "
      "%.0f s, last call %.1f s, grace %.1f s, work %.0f s; loss %.3f, duplicates %.3f, slow %.3f",
      schedule.seed,
      s.backend == Backend::kMusterd ? "musterd"
      : s.backend == Backend::kEtcd  ? "etcd"
                                     : "host mode",
      s.nodes, s.nproc, s.min_nodes, s.max_nodes, s.max_restarts,
      absl::ToDoubleSeconds(s.heartbeat_timeout), absl::ToDoubleSeconds(s.join_timeout),
      absl::ToDoubleSeconds(s.last_call_timeout), absl::ToDoubleSeconds(s.shutdown_grace),
      absl::ToDoubleSeconds(s.work), schedule.network.loss, schedule.network.duplicate,
      schedule.network.slow);
  for (const Fault& fault : schedule.faults) absl::StrAppend(&text, "\n  ", Describe(fault));
  return text;
}

Schedule DrawSchedule(uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + 1);
  auto uniform = [&](double low, double high) {
    return std::uniform_real_distribution<double>(low, high)(rng);
  };
  auto integer = [&](int low, int high) {
    return std::uniform_int_distribution<int>(low, high)(rng);
  };
  auto seconds = [&](double low, double high) { return absl::Seconds(uniform(low, high)); };
  Schedule schedule;
  schedule.seed = seed;
  JobShape& s = schedule.shape;
  s.backend = uniform(0, 1) < 0.6 ? Backend::kMusterd : Backend::kHost;
  s.nodes = integer(1, 4);
  s.nproc = integer(1, 2);
  const int spares = integer(0, 2);
  s.max_nodes = std::max(1, s.nodes + integer(-1, spares));
  s.min_nodes = integer(1, s.max_nodes);
  s.max_restarts = integer(0, 4);
  s.heartbeat_timeout = absl::Seconds(integer(3, 8));
  s.join_timeout = absl::Seconds(integer(15, 40));
  s.last_call_timeout = absl::Milliseconds(integer(0, 2000));
  s.keep_alive_interval = absl::Seconds(integer(1, 2));
  s.shutdown_grace = seconds(0.5, 5);
  s.work = seconds(3, 30);
  schedule.network.loss = uniform(0, 0.02);
  schedule.network.duplicate = uniform(0, 0.02);
  schedule.network.slow = uniform(0, 0.1);
  const int count = integer(0, 6);
  int next_spare = s.nodes;
  for (int i = 0; i < count; ++i) {
    Fault fault;
    fault.at = seconds(0, 60);
    const int pick = integer(0, 99);
    fault.host = integer(0, std::max(0, next_spare - 1));
    if (pick < 25) {
      fault.kind = FaultKind::kWorkerFails;
    } else if (pick < 37) {
      fault.kind = FaultKind::kAgentKilled;
      fault.length = uniform(0, 1) < 0.5 ? seconds(1, 10) : absl::ZeroDuration();
    } else if (pick < 49) {
      fault.kind = FaultKind::kAgentStopped;
      fault.length = seconds(1, 40);
    } else if (pick < 57) {
      fault.kind = FaultKind::kAgentLeaves;
    } else if (pick < 67) {
      fault.kind = FaultKind::kSpareJoins;
      fault.host = next_spare++;
    } else if (pick < 82) {
      fault.kind = pick < 76 ? FaultKind::kLinkCut : FaultKind::kRdzvCut;
      fault.length = seconds(1, 40);
    } else {
      fault.kind = s.backend == Backend::kMusterd ? FaultKind::kServerCrash : FaultKind::kLinkCut;
      fault.length = s.backend == Backend::kMusterd ? seconds(0.5, 20) : seconds(1, 40);
      fault.torn = uniform(0, 1);
    }
    schedule.faults.push_back(fault);
  }
  std::sort(schedule.faults.begin(), schedule.faults.end(),
            [](const Fault& a, const Fault& b) { return a.at < b.at; });
  // Two in five of the schedules with a rendezvous apart run on etcd, from
  // a draw of their own: what the other draws give is as it was.
  if (s.backend == Backend::kMusterd && std::mt19937_64(seed ^ 0xE7CDE7CDE7CDE7CDULL)() % 5 < 2) {
    s.backend = Backend::kEtcd;
  }
  return schedule;
}

Outcome Simulate(const Schedule& schedule, const RunOptions& options) {
  World world(schedule, options);
  return world.Run();
}

Schedule Shrink(const Schedule& schedule, const RunOptions& options) {
  Schedule best = schedule;
  bool smaller = true;
  while (smaller) {
    smaller = false;
    for (size_t i = 0; i < best.faults.size(); ++i) {
      Schedule trial = best;
      trial.faults.erase(trial.faults.begin() + static_cast<std::ptrdiff_t>(i));
      if (!Simulate(trial, options).violations.empty()) {
        best = std::move(trial);
        smaller = true;
        break;
      }
    }
  }
  return best;
}

}  // namespace muster::sim
