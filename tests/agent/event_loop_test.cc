// The agent's event loop: posted tasks, the timer against an injected
// clock, readable fds, signals from a signalfd.
#include "agent/event_loop.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace muster {
namespace {

using ::testing::ElementsAre;

TEST(EventLoopTest, PostedTasksRunInOrderOnTheLoopThread) {
  FakeClock clock;
  auto loop = EventLoop::Create(clock, {});
  ASSERT_TRUE(loop.ok()) << loop.status();
  std::vector<int> ran;
  std::thread poster([&] {
    for (int i = 0; i < 3; ++i) (*loop)->Post([&ran, i] { ran.push_back(i); });
  });
  poster.join();
  EventLoop::Handlers handlers;
  handlers.on_signal = [](int) {};
  handlers.on_timer = [] {};
  handlers.next_deadline = [] { return std::nullopt; };
  handlers.done = [&] { return ran.size() == 3; };
  ASSERT_TRUE((*loop)->Run(handlers).ok());
  EXPECT_THAT(ran, ElementsAre(0, 1, 2));
}

TEST(EventLoopTest, TheTimerIsArmedAgainstTheClockItWasGiven) {
  // The fake clock is far from the real one: only the distance to the deadline counts.
  FakeClock clock(absl::FromUnixSeconds(100));
  auto loop = EventLoop::Create(clock, {});
  ASSERT_TRUE(loop.ok()) << loop.status();
  int fired = 0;
  EventLoop::Handlers handlers;
  handlers.on_signal = [](int) {};
  handlers.on_timer = [&] { ++fired; };
  handlers.next_deadline = [&] { return clock.Now() + absl::Milliseconds(1); };
  handlers.done = [&] { return fired == 2; };
  ASSERT_TRUE((*loop)->Run(handlers).ok());
  EXPECT_EQ(fired, 2);
}

TEST(EventLoopTest, AReadableFdCallsItsReaderUntilRemoved) {
  FakeClock clock;
  auto loop = EventLoop::Create(clock, {});
  ASSERT_TRUE(loop.ok()) << loop.status();
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC | O_NONBLOCK), 0);
  UniqueFd read_end(fds[0]), write_end(fds[1]);
  std::string got;
  ASSERT_TRUE((*loop)
                  ->Add(read_end.get(),
                        [&] {
                          char buffer[16];
                          const ssize_t n = read(read_end.get(), buffer, sizeof buffer);
                          if (n > 0) got.append(buffer, static_cast<size_t>(n));
                        })
                  .ok());
  ASSERT_EQ(write(write_end.get(), "ab", 2), 2);
  EventLoop::Handlers handlers;
  handlers.on_signal = [](int) {};
  handlers.on_timer = [] {};
  handlers.next_deadline = [] { return std::nullopt; };
  handlers.done = [&] { return got == "ab"; };
  ASSERT_TRUE((*loop)->Run(handlers).ok());
  (*loop)->Remove(read_end.get());
  ASSERT_EQ(write(write_end.get(), "c", 1), 1);
  bool posted = false;
  (*loop)->Post([&] { posted = true; });
  handlers.done = [&] { return posted; };
  ASSERT_TRUE((*loop)->Run(handlers).ok());
  EXPECT_EQ(got, "ab") << "a removed fd is not read";
}

TEST(EventLoopTest, ASignalOfTheSetArrivesAsAnEvent) {
  sigset_t set, old;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR2);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &set, &old), 0);
  FakeClock clock;
  auto loop = EventLoop::Create(clock, {SIGUSR2});
  ASSERT_TRUE(loop.ok()) << loop.status();
  ASSERT_EQ(kill(getpid(), SIGUSR2), 0);
  int got = 0;
  EventLoop::Handlers handlers;
  handlers.on_signal = [&](int sig) { got = sig; };
  handlers.on_timer = [] {};
  handlers.next_deadline = [] { return std::nullopt; };
  handlers.done = [&] { return got != 0; };
  ASSERT_TRUE((*loop)->Run(handlers).ok());
  EXPECT_EQ(got, SIGUSR2);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

}  // namespace
}  // namespace muster
