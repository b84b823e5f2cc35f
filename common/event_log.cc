#include "common/event_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace muster {

absl::StatusOr<OpenedEventLog> OpenEventLog(const std::string& path, absl::string_view flag) {
  OpenedEventLog out;
  out.fd = UniqueFd(open(
      path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600));
  if (!out.fd.valid()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, ": cannot open (",
                                                   std::strerror(errno),
                                                   "); give a file in a directory you can write"));
  }
  struct stat st;
  if (fstat(out.fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, "=", path,
        ": not a regular file of yours; give a path of your own (the events name jobs)"));
  }
  if ((st.st_mode & 077) != 0) {
    out.warning = absl::StrFormat("%s=%s can be read by others (mode %03o)", flag, path,
                                  static_cast<unsigned>(st.st_mode & 0777));
  }
  return out;
}

EventLogWriter::EventLogWriter(UniqueFd fd, std::string name,
                               std::function<void(const std::string&)> warn)
    : fd_(std::move(fd)), name_(std::move(name)), warn_(std::move(warn)),
      thread_([this] { Run(); }) {}

EventLogWriter::~EventLogWriter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void EventLogWriter::Append(std::string line) {
  absl::MutexLock lock(&mu_);
  if (pending_.size() >= kMaxPending) {
    ++dropped_;
    return;
  }
  pending_.push_back(std::move(line));
}

void EventLogWriter::Run() {
  bool failed = false;
  for (;;) {
    std::deque<std::string> lines;
    uint64_t dropped = 0;
    bool stopping = false;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](EventLogWriter* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return self->stopping_ || !self->pending_.empty();
          },
          this));
      lines.swap(pending_);
      std::swap(dropped, dropped_);
      stopping = stopping_;
    }
    if (dropped > 0 && !failed) {
      warn_(absl::StrCat(name_, ": ", dropped, " event(s) left out: the file was written more ",
                         "slowly than events came (at most ", kMaxPending, " wait)"));
    }
    for (const std::string& line : lines) {
      if (failed) break;
      // The file is opened O_NONBLOCK (a FIFO must not block its open);
      // a regular file's write does not return EAGAIN, so a short write
      // is a failure like any other.
      if (write(fd_.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
        failed = true;
        warn_(absl::StrCat(name_, ": cannot write (", std::strerror(errno),
                           "); no more events go there"));
      }
    }
    if (stopping) return;
  }
}

}  // namespace muster
