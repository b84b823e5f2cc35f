// Writing JSON text for what muster prints for programs to read (the agent's
// events). Pure.
#ifndef MUSTER_COMMON_JSON_H_
#define MUSTER_COMMON_JSON_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace muster {

// `text` as a JSON string, quotes included: '"', '\\' and control characters
// escaped, valid UTF-8 kept as it is, and each byte of invalid UTF-8 (a
// worker's message may hold any bytes) written as U+FFFD, so the result is
// always valid JSON on one line.
std::string JsonQuote(absl::string_view text);

// An event of a job, as the agents' and musterd's event logs, `--event-log-handler
// console` and `musterctl watch --json` write it: one JSON object a line.
//
//   {"time": 1764921600.125, "job": "ID", "round": 3, "node": "host:pid:x1y2",
//    "kind": "round_started", "detail": "group rank 0 of 2, ranks 0-3 of 8"}
//
// time: Unix seconds, to the millisecond. round: the job's round the event
// belongs to (-1 before the first). node: the node id it is about ("" for
// none). The kinds are listed where the events are made (agent/events.h,
// rendezvous/rules/job_events.h).
struct EventLine {
  absl::Time time;
  std::string job;
  int64_t round = -1;
  std::string node;
  std::string kind;
  std::string detail;
};

// One line of JSON, ending in '\n'.
std::string EventJsonLine(const EventLine& event);

}  // namespace muster

#endif  // MUSTER_COMMON_JSON_H_
