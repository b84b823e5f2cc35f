// What the files of RendezvousState share and nothing else may use:
// state.cc (the transitions), state_validate.cc, state_queries.cc and
// state_journal.cc (restore and snapshot).
#ifndef MUSTER_RENDEZVOUS_RULES_STATE_INTERNAL_H_
#define MUSTER_RENDEZVOUS_RULES_STATE_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "proto/journal.pb.h"
#include "proto/rendezvous.pb.h"
#include "rendezvous/rules/state.h"

namespace muster::rdzv::state_internal {

// At most this many node names in a message; the rest are counted.
inline constexpr size_t kMaxNamedNodes = 16;

std::string FormatDuration(int64_t ms);
WatchEvent RoundChangedEvent(int64_t round, RoundChanged::Reason reason, const std::string& detail);
JournalRecord NodeDoneRecord(const std::string& job_id, const std::string& node_id, int64_t round);
JournalRecord RoundOpenedRecord(const std::string& job_id, int64_t round, int32_t restart_count,
                                const std::optional<WatchEvent>& event);
JournalRecord JobEndedRecord(const std::string& job_id, const JobConfig& config, int64_t round,
                             int32_t restart_count, const std::optional<WatchEvent>& event);
// kPermissionDenied: the request does not carry the node's secret.
absl::Status WrongSecret(const NodeKey& key);

}  // namespace muster::rdzv::state_internal

#endif  // MUSTER_RENDEZVOUS_RULES_STATE_INTERNAL_H_
