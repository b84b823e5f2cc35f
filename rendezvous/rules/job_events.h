// The rendezvous' job events (JobEvent) as people and programs read them:
// musterd --event-log, musterctl watch. Pure.
//
// The kinds, as EventLine's "kind" (common/json.h) names them:
//   node_joined    a node joined the job for the first time (node: its id)
//   node_lost      a node left, was lost, or gave up its join (detail: how)
//   round_started  a round formed: its workers start (detail: nodes, world
//                  size, master, restarts used)
//   worker_failed  a worker failed; the job restarts or closes (detail: the
//                  rank, host and exit, and which)
//   job_closed     the job ended (detail: "succeeded: ..." or "failed: ...")
//   job_forgotten  a job no node was in any more was dropped
#ifndef MUSTER_RENDEZVOUS_RULES_JOB_EVENTS_H_
#define MUSTER_RENDEZVOUS_RULES_JOB_EVENTS_H_

#include <string>

#include "common/json.h"
#include "proto/rendezvous.pb.h"

namespace muster::rdzv {

// "node_joined", ...; "unknown" for a kind this build does not know.
std::string JobEventKindName(JobEvent::Kind kind);

// Why a round was opened, as the metrics label it: "start" (a job's first
// round, REASON_UNSPECIFIED), "worker_failed", "node_joined", "node_lost".
std::string RoundReasonName(RoundChanged::Reason reason);

// The event as an EventLine; a job_closed event's detail starts with
// "succeeded: " or "failed: ".
EventLine ToEventLine(const JobEvent& event);

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_RULES_JOB_EVENTS_H_
