#include "rendezvous/rules/job_events.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace muster::rdzv {

std::string JobEventKindName(JobEvent::Kind kind) {
  switch (kind) {
    case JobEvent::NODE_JOINED: return "node_joined";
    case JobEvent::NODE_LOST: return "node_lost";
    case JobEvent::ROUND_STARTED: return "round_started";
    case JobEvent::WORKER_FAILED: return "worker_failed";
    case JobEvent::JOB_CLOSED: return "job_closed";
    case JobEvent::JOB_FORGOTTEN: return "job_forgotten";
    case JobEvent::NODE_EXCLUDED: return "node_excluded";
    case JobEvent::PROGRESS: return "progress";
    default: return "unknown";
  }
}

std::string RoundReasonName(RoundChanged::Reason reason) {
  switch (reason) {
    case RoundChanged::REASON_UNSPECIFIED: return "start";
    case RoundChanged::WORKER_FAILED: return "worker_failed";
    case RoundChanged::NODE_JOINED: return "node_joined";
    case RoundChanged::NODE_LOST: return "node_lost";
    default: return "unknown";
  }
}

EventLine ToEventLine(const JobEvent& event) {
  std::string detail = event.detail();
  if (event.kind() == JobEvent::JOB_CLOSED) {
    detail = absl::StrCat(event.succeeded() ? "succeeded: " : "failed: ", detail);
  }
  return EventLine{.time = absl::FromUnixMillis(event.time_unix_ms()),
                   .job = event.job_id(),
                   .round = event.round(),
                   .node = event.node_id(),
                   .kind = JobEventKindName(event.kind()),
                   .detail = std::move(detail)};
}

}  // namespace muster::rdzv
