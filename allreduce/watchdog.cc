#include "allreduce/watchdog.h"

#include <unistd.h>

#include <cstdio>

namespace muster::allreduce {

Watchdog::Watchdog(std::string who, absl::Duration limit)
    : who_(std::move(who)), limit_(limit), thread_([this] { Watch(); }) {}

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
  deadline_ = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(limit_);
}

void Watchdog::Disarm() {
  absl::MutexLock lock(&mu_);
  what_.clear();
}

void Watchdog::Watch() {
  absl::MutexLock lock(&mu_);
  // Looks ten times a second: limits are seconds.
  while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(100))) {
    if (!what_.empty() && std::chrono::steady_clock::now() >= deadline_) {
      std::fprintf(stderr,
                   "muster-allreduce: %s: error: %s did not finish within %s; a rank may have "
                   "died or hung\n",
                   who_.c_str(), what_.c_str(), absl::FormatDuration(limit_).c_str());
      std::fflush(stderr);
      _exit(1);  // the call cannot be interrupted; exiting frees the GPU and the sockets
    }
  }
}

}  // namespace muster::allreduce
