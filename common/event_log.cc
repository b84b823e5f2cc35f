#include "common/event_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

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
    wake_.Signal();
  }
  thread_.join();
}

void EventLogWriter::Append(std::string_view line) {
  absl::MutexLock lock(&mu_);
  if (pending_lines_ >= kMaxPending) {
    ++dropped_;
    return;
  }
  pending_.append(line);
  ++pending_lines_;
  if (writer_idle_) wake_.Signal();
}

absl::Status EventLogWriter::WriteAll(std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd_.get(), bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    // The file is opened O_NONBLOCK (a FIFO must not block its open); a
    // regular file's write does not return EAGAIN.
    if (n < 0)
      return absl::InternalError(absl::StrCat("cannot write (", std::strerror(errno), ")"));
    if (n == 0) return absl::InternalError("cannot write (it takes no more)");
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

void EventLogWriter::Run() {
  bool failed = false;
  std::string lines;
  for (;;) {
    uint64_t dropped = 0;
    bool stopping = false;
    lines.clear();
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && pending_lines_ == 0) {
        writer_idle_ = true;
        wake_.Wait(&mu_);
        writer_idle_ = false;
      }
      lines.swap(pending_);  // what came while the last batch was written
      pending_lines_ = 0;
      std::swap(dropped, dropped_);
      stopping = stopping_;
    }
    if (dropped > 0 && !failed) {
      warn_(absl::StrCat(name_, ": ", dropped, " event(s) left out: the file was written more ",
                         "slowly than events came (at most ", kMaxPending, " wait)"));
    }
    // Whole lines, all that waited, in as few writes as the file takes.
    if (!failed && !lines.empty()) {
      if (absl::Status written = WriteAll(lines); !written.ok()) {
        failed = true;
        warn_(absl::StrCat(name_, ": ", written.message(), "; no more events go there"));
      }
    }
    if (stopping) return;
    // Lets a burst gather: a thousand events a second cost a hundred
    // writes and wake-ups, not a thousand, and no line waits longer.
    absl::SleepFor(kBatchPause);
  }
}

}  // namespace muster
