#include "rendezvous/rules/state_internal.h"

#include "absl/strings/str_cat.h"
#include "rendezvous/rules/text.h"

namespace muster::rdzv::state_internal {

std::string FormatDuration(int64_t ms) { return absl::StrCat(ms / 1000.0, " s"); }

WatchEvent RoundChangedEvent(int64_t round, RoundChanged::Reason reason,
                             const std::string& detail) {
  WatchEvent event;
  RoundChanged* changed = event.mutable_round_changed();
  changed->set_new_round(round);
  changed->set_reason(reason);
  changed->set_detail(CutText(detail, kMaxDetailBytes));
  return event;
}

JournalRecord NodeDoneRecord(const std::string& job_id, const std::string& node_id, int64_t round) {
  JournalRecord record;
  NodeDone* done = record.mutable_node_done();
  done->set_job_id(job_id);
  done->set_node_id(node_id);
  done->set_round(round);
  return record;
}

JournalRecord RoundOpenedRecord(const std::string& job_id, int64_t round, int32_t restart_count,
                                const std::optional<WatchEvent>& event) {
  JournalRecord record;
  RoundOpened* opened = record.mutable_round_opened();
  opened->set_job_id(job_id);
  opened->set_round(round);
  opened->set_restart_count(restart_count);
  if (event) *opened->mutable_event() = *event;
  return record;
}

JournalRecord JobEndedRecord(const std::string& job_id, const JobConfig& config, int64_t round,
                             int32_t restart_count, const std::optional<WatchEvent>& event) {
  JournalRecord record;
  JobEnded* ended = record.mutable_job_ended();
  ended->set_job_id(job_id);
  *ended->mutable_config() = config;
  ended->set_round(round);
  ended->set_restart_count(restart_count);
  if (event) *ended->mutable_event() = *event;
  return record;
}

absl::Status WrongSecret(const NodeKey& key) {
  return absl::PermissionDeniedError(absl::StrCat(
      "the request for node ", key.node_id, " of job '", key.job_id,
      "' does not carry that node's secret; a node speaks only for itself: only the agent that "
      "joined as ",
      key.node_id, " may heartbeat, watch, report or leave for it"));
}

}  // namespace muster::rdzv::state_internal
