#include "agent/events.h"

namespace muster {

std::string RoundChangedKind(const rdzv::RoundChanged& changed) {
  switch (changed.reason()) {
    case rdzv::RoundChanged::WORKER_FAILED: return "job_restarting";
    case rdzv::RoundChanged::NODE_JOINED: return "node_joined";
    case rdzv::RoundChanged::NODE_LOST: return "node_lost";
    default: return "round_changed";
  }
}

}  // namespace muster
