#include "common/clock.h"

#include <chrono>

namespace muster {
namespace {

class RealClock final : public Clock {
 public:
  RealClock() : wall_start_(absl::Now()), steady_start_(std::chrono::steady_clock::now()) {}

  absl::Time Now() const override {
    return wall_start_ + absl::FromChrono(std::chrono::steady_clock::now() - steady_start_);
  }

 private:
  const absl::Time wall_start_;
  const std::chrono::steady_clock::time_point steady_start_;
};

}  // namespace

Clock& Clock::Real() {
  static RealClock* const clock = new RealClock();  // never destroyed: threads may outlive main
  return *clock;
}

absl::Time FakeClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

void FakeClock::Advance(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  if (d > absl::ZeroDuration()) now_ += d;
}

}  // namespace muster
