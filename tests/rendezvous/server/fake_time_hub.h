// The options of a hub whose time a test moves: no timer thread, so
// nothing times out until the test calls RunDueTimers.
#ifndef MUSTER_TESTS_RENDEZVOUS_SERVER_FAKE_TIME_HUB_H_
#define MUSTER_TESTS_RENDEZVOUS_SERVER_FAKE_TIME_HUB_H_

#include "common/clock.h"
#include "rendezvous/server/hub.h"

namespace muster::rdzv {

inline HubOptions FakeTimeHub(const Clock* clock) {
  HubOptions options;
  options.clock = clock;
  options.timer_thread = false;
  return options;
}

}  // namespace muster::rdzv

#endif  // MUSTER_TESTS_RENDEZVOUS_SERVER_FAKE_TIME_HUB_H_
