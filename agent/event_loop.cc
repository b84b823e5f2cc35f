#include "agent/event_loop.h"

#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>

#include "common/status.h"

namespace muster {

absl::StatusOr<std::unique_ptr<EventLoop>> EventLoop::Create(Clock& clock,
                                                             const std::vector<int>& signals) {
  std::unique_ptr<EventLoop> loop(new EventLoop(clock));
  loop->epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
  if (!loop->epoll_.valid()) return ErrnoToStatus(errno, "epoll_create1");
  sigset_t set;
  sigemptyset(&set);
  for (int sig : signals) sigaddset(&set, sig);
  loop->signal_fd_.reset(signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!loop->signal_fd_.valid()) return ErrnoToStatus(errno, "signalfd");
  loop->event_fd_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!loop->event_fd_.valid()) return ErrnoToStatus(errno, "eventfd");
  loop->timer_fd_.reset(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!loop->timer_fd_.valid()) return ErrnoToStatus(errno, "timerfd_create");
  for (int fd : {loop->signal_fd_.get(), loop->event_fd_.get(), loop->timer_fd_.get()}) {
    epoll_event ev = {};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(loop->epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      return ErrnoToStatus(errno, "epoll_ctl");
    }
  }
  return loop;
}

absl::Status EventLoop::Add(int fd, std::function<void()> on_readable) {
  epoll_event ev = {};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0)
    return ErrnoToStatus(errno, "epoll_ctl");
  readers_[fd] = std::move(on_readable);
  return absl::OkStatus();
}

void EventLoop::Remove(int fd) {
  if (readers_.erase(fd) > 0) epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
}

void EventLoop::Post(std::function<void()> task) {
  {
    absl::MutexLock lock(&mu_);
    posted_.push_back(std::move(task));
  }
  const uint64_t one = 1;
  ssize_t ignored = write(event_fd_.get(), &one, sizeof(one));
  (void)ignored;
}

void EventLoop::ArmTimer(std::optional<absl::Time> deadline) {
  // Relative to the clock, so that a fake or shifted clock means the same wait.
  itimerspec spec = {};
  if (deadline) {
    absl::Duration wait = *deadline - clock_.Now();
    if (wait < absl::Nanoseconds(1)) wait = absl::Nanoseconds(1);  // 0 would disarm it
    spec.it_value = absl::ToTimespec(wait);
  }
  timerfd_settime(timer_fd_.get(), 0, &spec, nullptr);
}

void EventLoop::RunPosted(const Handlers& handlers) {
  std::deque<std::function<void()>> tasks;
  {
    absl::MutexLock lock(&mu_);
    tasks.swap(posted_);
  }
  for (auto& task : tasks) {
    if (handlers.done()) return;
    task();
  }
}

absl::Status EventLoop::Run(const Handlers& handlers) {
  epoll_event events[32];
  while (!handlers.done()) {
    ArmTimer(handlers.next_deadline());
    const int n = epoll_wait(epoll_.get(), events, 32, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "epoll_wait");
    }
    for (int i = 0; i < n && !handlers.done(); ++i) {
      const int fd = events[i].data.fd;
      if (fd == signal_fd_.get()) {
        signalfd_siginfo info;
        while (!handlers.done() && read(signal_fd_.get(), &info, sizeof(info)) == sizeof(info)) {
          handlers.on_signal(static_cast<int>(info.ssi_signo));
        }
      } else if (fd == event_fd_.get()) {
        uint64_t count;
        ssize_t ignored = read(event_fd_.get(), &count, sizeof(count));
        (void)ignored;
        RunPosted(handlers);
      } else if (fd == timer_fd_.get()) {
        uint64_t expirations;
        ssize_t ignored = read(timer_fd_.get(), &expirations, sizeof(expirations));
        (void)ignored;
        handlers.on_timer();
      } else if (auto it = readers_.find(fd); it != readers_.end()) {
        // A copy: the reader may Remove itself.
        std::function<void()> reader = it->second;
        reader();
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace muster
