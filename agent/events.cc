#include "agent/events.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json.h"

namespace muster {

std::string EventJsonLine(const AgentEvent& event) {
  return absl::StrCat(
      "{\"time\": ", absl::StrFormat("%.3f", absl::ToDoubleSeconds(event.time - absl::UnixEpoch())),
      ", \"job\": ", JsonQuote(event.job), ", \"round\": ", event.round,
      ", \"node\": ", JsonQuote(event.node), ", \"kind\": ", JsonQuote(event.kind),
      ", \"detail\": ", JsonQuote(event.detail), "}\n");
}

std::string RoundChangedKind(const rdzv::RoundChanged& changed) {
  switch (changed.reason()) {
    case rdzv::RoundChanged::WORKER_FAILED: return "job_restarting";
    case rdzv::RoundChanged::NODE_JOINED: return "node_joined";
    case rdzv::RoundChanged::NODE_LOST: return "node_lost";
    default: return "round_changed";
  }
}

}  // namespace muster
