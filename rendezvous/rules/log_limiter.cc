#include "rendezvous/rules/log_limiter.h"

#include <utility>

#include "rendezvous/rules/text.h"

namespace muster::rdzv {

std::string ForLog(absl::string_view client_text, size_t max_bytes) {
  std::string out = CutText(client_text, max_bytes);
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) c = '?';
  }
  return out;
}

LogLimiter::Verdict LogLimiter::Allow(absl::string_view kind, absl::Time now) {
  Window& window = windows_[kind];
  if (now - window.start >= absl::Seconds(1)) {
    window.start = now;
    window.logged = 0;
  }
  if (window.logged >= per_second_) {
    ++window.dropped;
    return Verdict{};
  }
  ++window.logged;
  return Verdict{.log = true, .dropped = std::exchange(window.dropped, 0)};
}

}  // namespace muster::rdzv
