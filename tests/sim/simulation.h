// A deterministic simulation of a muster job: the real rendezvous (a
// RendezvousHub over RendezvousState, as musterd with its journal, as the
// node that hosts it, or as the etcd backend's elected leader) and N
// agents running the real elastic rules
// (ElasticState), with fake workers, a simulated clock and a simulated
// network that loses, delays, duplicates and reorders messages and cuts
// hosts off. Faults come from one seed: worker failures, agents killed,
// restarted, stopped (SIGSTOP) and stopped on purpose (SIGTERM), spares
// joining, links cut, musterd crashing on a torn journal and restarting.
// After every step the checker looks at what users would notice (see
// Invariants in simulation.cc); a schedule that breaks one can be replayed
// from its seed and shrunk to the fewest faults that still break it.
//
// Single-threaded and without wall-clock time: the same schedule gives the
// same steps, whatever the machine (Outcome::digest).
#ifndef MUSTER_TESTS_SIM_SIMULATION_H_
#define MUSTER_TESTS_SIM_SIMULATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace muster::sim {

// Where the job's rendezvous runs.
enum class Backend {
  kMusterd,  // musterd with --state-dir, on a host of its own
  kHost,     // in the agent of host 0 (host mode), no journal
  // --rdzv-backend etcd: etcd on a host of its own, the rules in the agent
  // elected leader (its state in etcd: the journal, never torn), each
  // node alive while its lease is (kept alive while its agent runs and
  // reaches etcd, for heartbeat_timeout after). A leader whose lease ends
  // hands over to another agent, which restores the state. Heartbeats read
  // what the leader wrote; a watch is of etcd, and outlives a leader.
  // Not modelled: the outbox and inbox keys themselves (a leader that
  // answered but did not write), and etcd's members one by one.
  kEtcd,
};

// The job: its command line, and how long its training takes.
struct JobShape {
  Backend backend = Backend::kMusterd;
  int nodes = 3;  // agents started at once, on hosts 0..nodes-1
  int nproc = 1;  // workers per node
  int min_nodes = 2;
  int max_nodes = 3;
  int max_restarts = 3;
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  absl::Duration join_timeout = absl::Seconds(30);
  absl::Duration last_call_timeout = absl::Seconds(1);
  absl::Duration keep_alive_interval = absl::Seconds(1);
  int keep_alive_max_attempt = 3;
  absl::Duration shutdown_grace = absl::Seconds(3);
  // A round whose ranks all run succeeds this long after its last rank started.
  absl::Duration work = absl::Seconds(20);
};

enum class FaultKind {
  kWorkerFails,   // a worker of the node exits 1
  kAgentKilled,   // kill -9 of the agent (its workers die with it); restarted after `length`
  kAgentStopped,  // SIGSTOP of the agent for `length`
  kAgentLeaves,   // SIGTERM to the agent: it stops its workers and leaves
  kSpareJoins,    // a new agent starts on a new host
  kLinkCut,       // the host's link is down for `length`
  kRdzvCut,       // only its route to the rendezvous' host is, for `length`: its peers reach it
  // musterd dies (mid-write: `torn` of its last write kept), back after
  // `length`; with etcd, the whole cluster is away for `length`
  kServerCrash,
};

struct Fault {
  absl::Duration at;  // from the start
  FaultKind kind = FaultKind::kWorkerFails;
  int host = 0;
  absl::Duration length;
  double torn = 1;
};

// What each message risks on its way.
struct NetworkFaults {
  double loss = 0;       // lost (its call ends at its deadline)
  double duplicate = 0;  // a request served twice
  double slow = 0;       // 50-500 ms late instead of 0.1-5 ms: reordered
};

struct Schedule {
  uint64_t seed = 0;
  JobShape shape;
  NetworkFaults network;
  std::vector<Fault> faults;
};

// Everything from the seed: the job's shape, the network and the faults.
Schedule DrawSchedule(uint64_t seed);

// "12.345 s: link of host 2 cut for 30.0 s".
std::string Describe(const Fault& fault);
std::string Describe(const Schedule& schedule);

// A rule of the system broken on purpose, to show the checker catches it.
enum class Breakage {
  kNone,
  // musterd's journal keeps no restart count: a restarted musterd forgets
  // the restarts spent.
  kRestartCountNotJournaled,
};

struct RunOptions {
  Breakage breakage = Breakage::kNone;
  bool trace = false;  // keep a line per step (Outcome::trace)
};

struct Outcome {
  std::vector<std::string> violations;  // each with its simulated time; empty: none
  uint64_t digest = 0;                  // of every step: same schedule, same digest
  int64_t steps = 0;
  absl::Duration ended_at;  // when the last agent exited
  std::string ending;       // how the job ended, for the log
  std::vector<std::string> trace;
};

Outcome Simulate(const Schedule& schedule, const RunOptions& options = {});

// The schedule with the fewest faults, a subset of `schedule`'s, that still
// breaks an invariant. REQUIRES: Simulate(schedule, options) breaks one.
Schedule Shrink(const Schedule& schedule, const RunOptions& options = {});

}  // namespace muster::sim

#endif  // MUSTER_TESTS_SIM_SIMULATION_H_
