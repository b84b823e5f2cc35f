#include "agent/preload.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "agent/stack_capture.h"
#include "common/status.h"

namespace muster {
namespace {

// Milliseconds left until `deadline` for poll(), at least 0.
int MillisLeft(absl::Time deadline) {
  return static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
}

// Waits until `fd` is ready for `events`, or the deadline.
absl::Status Await(int fd, short events, absl::Time deadline, absl::string_view what) {
  pollfd p{fd, events, 0};
  int n;
  do {
    n = poll(&p, 1, MillisLeft(deadline));
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoToStatus(errno, "poll");
  if (n == 0) return absl::DeadlineExceededError(absl::StrCat("it did not ", what, " in time"));
  return absl::OkStatus();
}

std::string Describe(const ExitStatus& status) {
  return status.signal != 0 ? absl::StrCat("killed by signal ", status.signal)
                            : absl::StrCat("exit code ", status.exit_code);
}

// " (killed by signal 9)", when `pid`, a child whose socket just closed,
// ends within a moment; left for the agent's reaper (WNOWAIT).
std::string HowItEnded(pid_t pid) {
  const absl::Time deadline = absl::Now() + absl::Milliseconds(200);
  do {
    siginfo_t info = {};
    if (waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid) {
      ExitStatus status;
      (info.si_code == CLD_EXITED ? status.exit_code : status.signal) = info.si_status;
      return absl::StrCat(" (", Describe(status), ")");
    }
    usleep(1000);
  } while (absl::Now() < deadline);
  return "";
}

// The request's body: NUL-separated argc, argv, envc, env, CPUs, memory nodes,
// and this machine's number of the set_mempolicy system call.
std::string RequestBody(const SpawnOptions& options) {
  std::string body = absl::StrCat(options.argv.size());
  for (const std::string& arg : options.argv)
    absl::StrAppend(&body, absl::string_view("\0", 1), arg);
  absl::StrAppend(&body, absl::string_view("\0", 1), options.env.size());
  for (const std::string& entry : options.env) {
    absl::StrAppend(&body, absl::string_view("\0", 1), entry);
  }
  absl::StrAppend(&body, absl::string_view("\0", 1), absl::StrJoin(options.cpus, ","),
                  absl::string_view("\0", 1), absl::StrJoin(options.memory_nodes, ","),
                  absl::string_view("\0", 1), SYS_set_mempolicy);
  return body;
}

}  // namespace

Preloader::Preloader(PreloadOptions options, ProcessRunner& cold, EventLoop& loop,
                     OnChange on_change)
    : options_(std::move(options)), cold_(cold), loop_(loop), on_change_(std::move(on_change)),
      logger_(Logger("agent")) {}

Preloader::~Preloader() {
  if (socket_.valid()) loop_.Remove(socket_.get());
  Kill();
}

void Preloader::Kill() {
  if (!interpreter_) return;
  // Not waited for: an import stuck in the kernel (D state on a network
  // file system) ends only when its I/O does; the agent's reaper reaps it.
  interpreter_->SignalGroup(SIGKILL);
  interpreter_->Abandon();
  interpreter_.reset();
}

absl::StatusOr<std::unique_ptr<Preloader>> Preloader::Start(PreloadOptions options,
                                                            ProcessRunner& cold, EventLoop& loop,
                                                            OnChange on_change) {
  std::unique_ptr<Preloader> preloader(
      new Preloader(std::move(options), cold, loop, std::move(on_change)));
  const PreloadOptions& opts = preloader->options_;
  const std::string script = opts.dir + "/muster_preload.py";
  MUSTER_RETURN_IF_ERROR(WriteScript(script, kPreloadServerSource));
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    return ErrnoToStatus(errno, "socketpair");
  }
  preloader->socket_.reset(pair[0]);
  UniqueFd theirs(pair[1]);
  if (theirs.get() <= STDERR_FILENO) {
    // An agent started with stdout or stderr closed: not there, which the
    // interpreter takes for its own.
    theirs.reset(fcntl(theirs.get(), F_DUPFD_CLOEXEC, STDERR_FILENO + 1));
    if (!theirs.valid()) return ErrnoToStatus(errno, "fcntl F_DUPFD_CLOEXEC");
  }
  // Its end crosses the exec; nothing else is started meanwhile (this thread starts them all).
  fcntl(theirs.get(), F_SETFD, 0);
  SpawnOptions spawn;
  spawn.argv = opts.interpreter;
  spawn.argv.push_back(script);
  spawn.argv.push_back(absl::StrCat(theirs.get()));
  if (opts.module) spawn.argv.push_back("-m");
  spawn.argv.push_back(opts.target);
  spawn.argv.insert(spawn.argv.end(), opts.modules.begin(), opts.modules.end());
  spawn.env = opts.env;
  spawn.capture_output = false;  // what the imports print goes to the agent's console, once
  absl::StatusOr<std::unique_ptr<Process>> started = cold.Spawn(spawn);
  if (!started.ok()) return started.status();
  preloader->interpreter_ = *std::move(started);
  fcntl(preloader->socket_.get(), F_SETFL, O_NONBLOCK);
  preloader->started_ = absl::Now();
  Preloader* self = preloader.get();
  MUSTER_RETURN_IF_ERROR(loop.Add(self->socket_.get(), [self] { self->OnReadable(); }));
  return preloader;
}

void Preloader::OnReadable() {
  char buffer[4096];
  ssize_t n;
  do {
    n = read(socket_.get(), buffer, sizeof(buffer));
  } while (n < 0 && errno == EINTR);
  if (n < 0) return;  // EAGAIN: nothing after all
  if (n == 0) {
    Break(absl::StrCat(state_ == State::kReady ? "ended" : "ended before its imports were done",
                       HowItEnded(interpreter_->pid())));
    return;
  }
  said_.append(buffer, n);
  const size_t newline = said_.find('\n');
  if (newline == std::string::npos || state_ != State::kImporting) return;
  absl::string_view line = absl::string_view(said_).substr(0, newline);
  if (absl::ConsumePrefix(&line, "error: ")) {
    Break(std::string(line));
    return;
  }
  state_ = State::kReady;
  const std::string ready =
      absl::StrFormat("%s imported in %.2f s (pid %d)", absl::StrJoin(options_.modules, ", "),
                      absl::ToDoubleSeconds(absl::Now() - started_), interpreter_->pid());
  logger_->info("--preload: {}; workers are forked from it", ready);
  if (on_change_) on_change_(state_, ready);
}

bool Preloader::OnExit(pid_t pid, ExitStatus status) {
  if (!interpreter_ || interpreter_->pid() != pid) return false;
  interpreter_->MarkExited(status);
  Break(absl::StrCat("ended (", Describe(status), ")"));
  return true;
}

void Preloader::Break(const std::string& why) {
  if (state_ == State::kBroken) return;
  state_ = State::kBroken;
  logger_->warn("--preload: the preloaded interpreter {}; workers start cold from now on", why);
  loop_.Remove(socket_.get());
  socket_.reset();
  Kill();
  // The agent starts a start the imports held back: never this Spawn's,
  // whose start it took before asking.
  if (on_change_) on_change_(state_, why);
}

absl::StatusOr<std::unique_ptr<Process>> Preloader::Spawn(const SpawnOptions& options) {
  if (!options.python_script || !options.capture_output) return cold_.Spawn(options);
  if (state_ == State::kImporting) {
    Break(absl::StrCat("was still importing ",
                       absl::FormatDuration(absl::Trunc(absl::Now() - started_, absl::Seconds(1))),
                       " after it started"));
  }
  if (state_ == State::kReady) {
    absl::StatusOr<std::unique_ptr<Process>> forked = Fork(options);
    if (forked.ok()) {
      ++forked_;
      return forked;
    }
    Break(absl::StrCat("could not fork a worker: ", forked.status().message()));
  }
  ++cold_started_;
  return cold_.Spawn(options);
}

absl::Status Preloader::SendRequest(const SpawnOptions& options, int out, int err, int report) {
  const absl::Time deadline = absl::Now() + options_.fork_limit;
  const std::string body = RequestBody(options);
  unsigned char header[8];
  for (int i = 0; i < 8; ++i) header[i] = static_cast<unsigned char>(body.size() >> (8 * i));
  iovec iov{header, sizeof(header)};
  alignas(cmsghdr) char control[CMSG_SPACE(3 * sizeof(int))] = {};
  msghdr message = {};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  cmsghdr* rights = CMSG_FIRSTHDR(&message);
  rights->cmsg_level = SOL_SOCKET;
  rights->cmsg_type = SCM_RIGHTS;
  rights->cmsg_len = CMSG_LEN(3 * sizeof(int));
  const int fds[3] = {out, err, report};
  std::memcpy(CMSG_DATA(rights), fds, sizeof(fds));
  // 8 bytes into an empty socket: whole, or not at all.
  MUSTER_RETURN_IF_ERROR(Await(socket_.get(), POLLOUT, deadline, "take the request"));
  if (sendmsg(socket_.get(), &message, MSG_NOSIGNAL) != sizeof(header)) {
    return ErrnoToStatus(errno, "sendmsg");
  }
  for (size_t sent = 0; sent < body.size();) {
    MUSTER_RETURN_IF_ERROR(Await(socket_.get(), POLLOUT, deadline, "take the request"));
    const ssize_t n = send(socket_.get(), body.data() + sent, body.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EINTR && errno != EAGAIN) return ErrnoToStatus(errno, "send");
    if (n > 0) sent += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Process>> Preloader::Fork(const SpawnOptions& options) {
  UniqueFd out_read, out_write, err_read, err_write, report_read, report_write;
  MUSTER_RETURN_IF_ERROR(MakePipe(&out_read, &out_write));
  MUSTER_RETURN_IF_ERROR(MakePipe(&err_read, &err_write));
  MUSTER_RETURN_IF_ERROR(MakePipe(&report_read, &report_write));
  MUSTER_RETURN_IF_ERROR(
      SendRequest(options, out_write.get(), err_write.get(), report_write.get()));
  out_write.reset();
  err_write.reset();
  report_write.reset();
  // The middle process writes the worker's pid; the worker closes its end
  // (EOF) once it is set up, or writes why it could not be.
  const absl::Time deadline = absl::Now() + options_.fork_limit;
  std::string report;
  for (;;) {
    absl::Status ready = Await(report_read.get(), POLLIN, deadline, "set the worker up");
    if (!ready.ok()) {
      pid_t pid = 0;
      if (absl::SimpleAtoi(report.substr(0, report.find('\n')), &pid) && pid > 0) {
        kill(-pid, SIGKILL);
        kill(pid, SIGKILL);
      }
      return ready;
    }
    char buffer[512];
    const ssize_t n = read(report_read.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    report.append(buffer, n);
  }
  if (const size_t error = report.find("error: "); error != std::string::npos) {
    return absl::FailedPreconditionError(absl::StripAsciiWhitespace(report.substr(error + 7)));
  }
  pid_t pid = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(report), &pid) || pid <= 0) {
    return absl::InternalError("it ended before the worker was set up");
  }
  return std::unique_ptr<Process>(
      ChildProcess::Adopt(pid, std::move(out_read), std::move(err_read)));
}

}  // namespace muster
