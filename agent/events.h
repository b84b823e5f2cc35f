// The agent's events, for `--event-log-handler console`: what a person
// watching the job, or a program reading its stderr, wants to be told, one
// JSON object a line (torchrun's console handler also prints JSON lines,
// with a schema of its own). Pure.
//
//   {"time": 1764921600.125, "job": "ID", "round": 3, "node": "host:pid:x1y2",
//    "kind": "round_started", "detail": "group rank 0 of 2, ranks 0-3 of 8"}
//
// time: Unix seconds, to the millisecond. round: the job's round the event
// belongs to (-1 before the first). kind, one of:
//   round_started  this node's workers were started for the round
//   worker_failed  one of this node's workers failed (this node reports it)
//   job_restarting the job moved to a new round for a worker's failure (any
//                  node's), using one of its restarts
//   node_joined    the job moved to a new round for a node that joined
//   node_lost      ... for a node that left or was lost
//   round_changed  ... for a reason the rendezvous did not give, or seen
//                  only in a heartbeat's answer (its push was lost)
//   job_closed     the rendezvous closed the job (detail: why)
//   agent_exited   this agent is about to exit (detail: its exit code, why)
#ifndef MUSTER_AGENT_EVENTS_H_
#define MUSTER_AGENT_EVENTS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "proto/rendezvous.pb.h"

namespace muster {

struct AgentEvent {
  absl::Time time;
  std::string job;
  int64_t round = -1;
  std::string node;
  std::string kind;
  std::string detail;
};

// One line of JSON, ending in '\n'.
std::string EventJsonLine(const AgentEvent& event);

// The kind of the event a RoundChanged push is (node_joined, node_lost,
// job_restarting; round_changed when the reason is not given).
std::string RoundChangedKind(const rdzv::RoundChanged& changed);

}  // namespace muster

#endif  // MUSTER_AGENT_EVENTS_H_
