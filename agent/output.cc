#include "agent/output.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muster {
namespace {

// Blocks SIGPIPE in the calling thread for its lifetime. If a write under it raised SIGPIPE and the
// caller had not blocked SIGPIPE itself, Consume() takes the signal back so it is never delivered.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&sigpipe_);
    sigaddset(&sigpipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &sigpipe_, &old_mask_);
  }
  ~ScopedSigpipeBlock() { pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr); }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

  void Consume() {
    // A SIGPIPE pending while the caller blocks it is the caller's (e.g. for a signalfd).
    if (sigismember(&old_mask_, SIGPIPE)) return;
    const timespec no_wait = {};
    while (sigtimedwait(&sigpipe_, nullptr, &no_wait) < 0 && errno == EINTR) {
    }
  }

 private:
  sigset_t sigpipe_;
  sigset_t old_mask_;
};

// Waits until fd is writable or the deadline passes; false on timeout.
bool WaitWritable(int fd, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p = {.fd = fd, .events = POLLOUT, .revents = 0};
    int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n > 0) return true;  // Writable, or an error the next write() reports.
    if (n < 0 && errno != EINTR) return false;
  }
}

// Writes all of `data` to the file `fd`; `what` names the write in an error.
absl::Status WriteWhole(int fd, std::string_view data, const char* what) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 ? ErrnoToStatus(errno, what)
                 : absl::InternalError(absl::StrCat(what, ": no progress"));
  }
  return absl::OkStatus();
}

}  // namespace

LineDuplicator::LineDuplicator(std::vector<std::string> filters, UniqueFd file)
    : filters_(std::move(filters)), file_(std::move(file)) {}

void LineDuplicator::Offer(std::string_view line, size_t prefix_size) {
  if (!file_.valid()) return;
  const std::string_view body = line.substr(prefix_size);
  const bool wanted = std::any_of(filters_.begin(), filters_.end(), [&](const std::string& filter) {
    return body.find(filter) != std::string_view::npos;
  });
  if (!wanted) return;
  status_ = WriteWhole(file_.get(), line, "write the filtered lines' file");
  if (!status_.ok()) file_.reset();
}

WorkerOutput::WorkerOutput(std::string prefix, int console_fd, UniqueFd file,
                           LineDuplicator* duplicate)
    : line_(std::move(prefix)), prefix_size_(line_.size()), console_fd_(console_fd),
      duplicate_(duplicate), file_(std::move(file)) {}

void WorkerOutput::Append(std::string_view bytes) {
  if (file_.valid()) WriteFile(bytes);
  while (wants_lines() && !bytes.empty()) {
    const size_t room = kMaxLineBytes - (line_.size() - prefix_size_);
    // A '\n' at index `room` still ends a line of exactly kMaxLineBytes.
    const size_t search = std::min(bytes.size(), room + 1);
    const void* newline = std::memchr(bytes.data(), '\n', search);
    if (newline != nullptr) {
      const size_t end = static_cast<const char*>(newline) - bytes.data() + 1;
      line_.append(bytes.substr(0, end));
      bytes.remove_prefix(end);
      EmitLine();
    } else if (bytes.size() > room) {
      line_.append(bytes.substr(0, room));
      line_.push_back('\n');
      bytes.remove_prefix(room);
      EmitLine();
    } else {
      line_.append(bytes);
      return;
    }
  }
}

void WorkerOutput::Finish() {
  if (!wants_lines() || !has_pending()) return;
  line_.push_back('\n');
  EmitLine();
}

void WorkerOutput::EmitLine() {
  if (console_fd_ >= 0) WriteConsole(line_);
  if (duplicate_ != nullptr) duplicate_->Offer(line_, prefix_size_);
  line_.resize(prefix_size_);
  if (!wants_lines()) line_.shrink_to_fit();  // The console is gone: nothing will be buffered.
}

void WorkerOutput::WriteConsole(std::string_view data) {
  ScopedSigpipeBlock sigpipe_block;
  size_t written = 0;
  bool waited = false;
  std::chrono::steady_clock::time_point deadline;
  while (written < data.size()) {
    ssize_t n = ::write(console_fd_, data.data() + written, data.size() - written);
    if (n > 0) {
      written += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!console_stalled_) {
        if (!waited) {
          waited = true;
          deadline =
              std::chrono::steady_clock::now() + std::chrono::milliseconds(kConsoleStallTimeoutMs);
        }
        if (WaitWritable(console_fd_, deadline)) continue;
        console_stalled_ = true;
      }
      // Dropping the rest of a line already begun: end it so the next prefix starts a line.
      if (written > 0) (void)!::write(console_fd_, "\n", 1);
      return;
    }
    // EPIPE (reader gone), EBADF, EIO, or a write() that made no progress: stop using the console.
    if (n < 0 && errno == EPIPE) sigpipe_block.Consume();
    console_fd_ = -1;
    return;
  }
  console_stalled_ = false;
}

void WorkerOutput::WriteFile(std::string_view data) {
  file_status_ = WriteWhole(file_.get(), data, "write log file");
  if (!file_status_.ok()) file_.reset();
}

absl::Status MakeDirs(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("mkdir: empty path");
  // Each prefix ending just before a '/' (and the whole path) is a directory to make; "a//b" and a
  // trailing '/' only make harmless repeats.
  for (size_t end = path.find('/', 1);; end = path.find('/', end + 1)) {
    const std::string dir = path.substr(0, end);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      const int mkdir_errno = errno;
      struct stat st;
      // mkdir may fail with EACCES or EROFS on a directory that exists already.
      if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        return ErrnoToStatus(mkdir_errno, absl::StrCat("mkdir ", dir));
      }
    }
    if (end == std::string::npos) break;
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path));
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("mkdir ", path, ": exists, not a directory"));
  }
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> OpenLogFile(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    MUSTER_RETURN_IF_ERROR(MakeDirs(path.substr(0, slash)));
  }
  int fd;
  do {
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  return UniqueFd(fd);
}

}  // namespace muster
