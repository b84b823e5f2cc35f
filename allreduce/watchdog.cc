#include "allreduce/watchdog.h"

#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace muster::allreduce {

Watchdog::Watchdog(std::string who, absl::Duration limit, Clock& clock)
    : who_(std::move(who)), limit_(limit), clock_(clock), thread_([this] { Watch(); }) {}

Watchdog::~Watchdog() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void Watchdog::Arm(std::string what) {
  absl::MutexLock lock(&mu_);
  what_ = std::move(what);
  deadline_ = clock_.Now() + limit_;
}

void Watchdog::Disarm() {
  absl::MutexLock lock(&mu_);
  what_.clear();
}

std::string Watchdog::Overdue() const {
  absl::MutexLock lock(&mu_);
  return OverdueLocked();
}

std::string Watchdog::OverdueLocked() const {
  if (what_.empty() || clock_.Now() < deadline_) return "";
  return absl::StrCat(who_, ": error: ", what_, " did not finish within ",
                      absl::FormatDuration(limit_), "; a rank may have died or hung");
}

void Watchdog::Watch() {
  absl::MutexLock lock(&mu_);
  // Looks ten times a second: limits are seconds.
  while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(100))) {
    const std::string overdue = OverdueLocked();
    if (!overdue.empty()) {
      std::fprintf(stderr, "muster-allreduce: %s\n", overdue.c_str());
      std::fflush(stderr);
      _exit(1);  // the call cannot be interrupted; exiting frees the GPU and the sockets
    }
  }
}

}  // namespace muster::allreduce
