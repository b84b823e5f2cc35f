// Rate limits for log lines that echo what clients send (refused joins,
// malformed requests): a flood of bad requests must not become a flood of
// log lines. The time is passed in.
//
// Thread safety: none; the caller serializes calls.
#ifndef MUSTER_RENDEZVOUS_RULES_LOG_LIMITER_H_
#define MUSTER_RENDEZVOUS_RULES_LOG_LIMITER_H_

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace muster::rdzv {

// The most of a client's string a log line shows, in bytes.
inline constexpr size_t kMaxLoggedClientBytes = 256;

// A client's string as a log line or a message may show it: cut to
// `max_bytes`, control characters (a newline that would forge a line) shown
// as '?'.
std::string ForLog(absl::string_view client_text, size_t max_bytes = kMaxLoggedClientBytes);

class LogLimiter {
 public:
  // At most `per_second` lines of each kind in any one second.
  explicit LogLimiter(int per_second = 10) : per_second_(per_second) {}

  struct Verdict {
    bool log = false;
    // Lines of this kind left out since the last that was logged: say so
    // with this one.
    int64_t dropped = 0;
  };
  // Whether a line of `kind` may be logged at `now`.
  Verdict Allow(absl::string_view kind, absl::Time now);

 private:
  struct Window {
    absl::Time start = absl::InfinitePast();
    int logged = 0;
    int64_t dropped = 0;
  };
  const int per_second_;
  absl::flat_hash_map<std::string, Window> windows_;  // a few kinds, named in the code
};

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_RULES_LOG_LIMITER_H_
