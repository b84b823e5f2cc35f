// The agent's events, for `--event-log-handler console`: what a person
// watching the job, or a program reading its stderr, wants to be told, one
// JSON object a line (torchrun's console handler also prints JSON lines,
// with a schema of its own). Pure. Each is an EventLine (common/json.h,
// where the line's fields are), with this node's id in "node". kind, one of:
//   preflight_started this node's pre-flight all-reduce workers were
//                  started (--preflight allreduce; round_started follows
//                  when it passes)
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
//   gpu_warning    the GPU check found local ranks sharing a GPU while
//                  another runs none, or a GPU idle (detail: the warning)
//   gpu_cleared    a warned picture is gone (detail: what changed)
//   gpu_sample     a full GPU check: each GPU's utilization, memory and
//                  local ranks (detail), every --gpu-check-interval
//   gpu_fault      the GPU check found a hardware fault (detail: the GPU
//                  and the fault): this node leaves, its host excluded
//   node_excluded  the job excluded this node's host (detail: why)
//   progress       this node's workers reached a new step (MUSTER_PROGRESS_FILE):
//                  the first of each round, then at most one a minute
//   preload_ready  --preload's interpreter imported the modules (detail:
//                  which, how long, its pid): workers are forked from it
//   preload_broken it failed (detail: why): workers start cold from now on
#ifndef MUSTER_AGENT_EVENTS_H_
#define MUSTER_AGENT_EVENTS_H_

#include <cstdint>
#include <string>

#include "common/json.h"
#include "proto/rendezvous.pb.h"

namespace muster {

// The agent's events are common/json.h's event lines.
using AgentEvent = EventLine;

// The kind of the event a RoundChanged push is (node_joined, node_lost,
// job_restarting; round_changed when the reason is not given).
std::string RoundChangedKind(const rdzv::RoundChanged& changed);

}  // namespace muster

#endif  // MUSTER_AGENT_EVENTS_H_
