#include "agent/file_timer.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace muster {
namespace {

using google::protobuf::Value;

absl::Status BadField(const char* name, const char* want) {
  return absl::InvalidArgumentError(absl::StrCat("\"", name, "\" is missing or not ", want));
}

// A JSON number that is a whole number in range, as Python's json writes an int.
std::optional<int64_t> WholeNumber(const Value* value, double min, double max) {
  if (value == nullptr || value->kind_case() != Value::kNumberValue) return std::nullopt;
  const double number = value->number_value();
  if (!std::isfinite(number) || number != std::floor(number) || number < min || number > max) {
    return std::nullopt;
  }
  return static_cast<int64_t>(number);
}

}  // namespace

absl::StatusOr<FileTimerRequest> ParseFileTimerRequest(std::string_view line) {
  google::protobuf::Struct message;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(line.data(), line.size()), &message);
  if (!parsed.ok()) return absl::InvalidArgumentError("not a JSON object");
  const auto& fields = message.fields();
  auto find = [&](const char* key) -> const Value* {
    auto it = fields.find(key);
    return it == fields.end() ? nullptr : &it->second;
  };
  if (const Value* version = find("version"); version != nullptr) {
    if (WholeNumber(version, 1, 1) == std::nullopt) {
      return absl::InvalidArgumentError("\"version\" is not 1");
    }
  }
  FileTimerRequest request;
  const std::optional<int64_t> pid = WholeNumber(find("pid"), 1, INT_MAX);
  if (!pid) return BadField("pid", "a process id");
  request.pid = *pid;
  const Value* scope = find("scope_id");
  if (scope == nullptr || scope->kind_case() != Value::kStringValue) {
    return BadField("scope_id", "a string");
  }
  request.scope_id = scope->string_value();
  const Value* expiration = find("expiration_time");
  if (expiration == nullptr || expiration->kind_case() != Value::kNumberValue ||
      !std::isfinite(expiration->number_value())) {
    return BadField("expiration_time", "a number");
  }
  request.expiration_time = expiration->number_value();
  // Negative and zero signals are allowed: torch keeps such a timer and only
  // never acts on it.
  const std::optional<int64_t> signal = WholeNumber(find("signal"), INT_MIN, 64);
  if (!signal) return BadField("signal", "a signal number");
  request.signal = static_cast<int>(*signal);
  return request;
}

FileTimers::Outcome FileTimers::Take(std::string_view line,
                                     const std::function<bool(pid_t)>& is_ours) {
  absl::StatusOr<FileTimerRequest> request = ParseFileTimerRequest(line);
  if (!request.ok()) {
    ++bad_lines_;
    return Outcome::kBadLine;
  }
  const pid_t pid = static_cast<pid_t>(request->pid);
  if (!is_ours(pid)) {
    ++foreign_lines_;
    return Outcome::kForeignPid;
  }
  auto key = std::make_pair(pid, std::move(request->scope_id));
  if (request->expiration_time < 0) {
    timers_.erase(key);
    return Outcome::kReleased;
  }
  timers_[std::move(key)] = Timer{
      absl::FromUnixMicros(static_cast<int64_t>(std::llround(request->expiration_time * 1e6))),
      request->signal};
  return Outcome::kSet;
}

std::vector<TimerExpiry> FileTimers::Expire(absl::Time now) {
  std::map<pid_t, TimerExpiry> by_pid;
  for (const auto& [key, timer] : timers_) {
    if (timer.expires > now) continue;
    auto [it, first] = by_pid.try_emplace(key.first);
    TimerExpiry& chosen = it->second;
    // Earliest with a signal wins; among timers without one, the earliest.
    const bool better =
        first || (timer.signal > 0 && chosen.signal <= 0) ||
        ((timer.signal > 0) == (chosen.signal > 0) && timer.expires < chosen.expired_at);
    if (better) chosen = TimerExpiry{key.first, key.second, timer.signal, timer.expires};
  }
  std::vector<TimerExpiry> expired;
  for (auto& [pid, expiry] : by_pid) {
    Forget(pid);
    if (expiry.signal < 0) expiry.signal = 0;
    expired.push_back(std::move(expiry));
  }
  return expired;
}

std::vector<pid_t> FileTimers::DueBy(absl::Time t) const {
  std::vector<pid_t> pids;
  for (const auto& [key, timer] : timers_) {
    if (timer.expires <= t && timer.signal > 0 && (pids.empty() || pids.back() != key.first)) {
      pids.push_back(key.first);
    }
  }
  return pids;
}

std::optional<absl::Time> FileTimers::NextExpiry() const {
  std::optional<absl::Time> next;
  for (const auto& [key, timer] : timers_) {
    if (!next || timer.expires < *next) next = timer.expires;
  }
  return next;
}

void FileTimers::Forget(pid_t pid) {
  timers_.erase(timers_.lower_bound({pid, std::string()}),
                timers_.lower_bound({pid + 1, std::string()}));
}

absl::StatusOr<TimerPipe> TimerPipe::Create(const std::string& path) {
  TimerPipe pipe;
  if (path.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = absl::StrCat(tmp && *tmp ? tmp : "/tmp", "/muster-timer-XXXXXX");
    if (mkdtemp(dir.data()) == nullptr) return ErrnoToStatus(errno, "mkdtemp " + dir);
    pipe.made_dir_ = dir;
    pipe.path_ = dir + "/timer";
  } else {
    pipe.path_ = path;
    struct stat st;
    if (lstat(path.c_str(), &st) == 0) {
      if (!S_ISFIFO(st.st_mode)) {
        return absl::FailedPreconditionError(absl::StrCat(
            kTimerFileEnv, "=", path, " exists and is not a named pipe; remove it, or unset ",
            kTimerFileEnv, " to let muster make one"));
      }
      if (unlink(path.c_str()) != 0) return ErrnoToStatus(errno, "unlink " + path);
    }
  }
  if (mkfifo(pipe.path_.c_str(), 0600) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("mkfifo ", pipe.path_, " (for ", kTimerFileEnv, ")"));
  }
  // The umask may only take bits away; this says exactly what is meant.
  if (chmod(pipe.path_.c_str(), 0600) != 0) return ErrnoToStatus(errno, "chmod " + pipe.path_);
  pipe.read_.reset(open(pipe.path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!pipe.read_.valid()) return ErrnoToStatus(errno, "open " + pipe.path_);
  pipe.write_.reset(open(pipe.path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
  if (!pipe.write_.valid()) return ErrnoToStatus(errno, "open " + pipe.path_ + " for writing");
  return pipe;
}

TimerPipe::~TimerPipe() {
  if (!read_.valid()) return;  // moved from
  unlink(path_.c_str());
  if (!made_dir_.empty()) rmdir(made_dir_.c_str());
}

void TimerPipe::Read(const std::function<void(std::string_view)>& on_line) {
  char buffer[PIPE_BUF * 4];
  for (;;) {
    const ssize_t n = read(read_.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // EAGAIN: all read (never EOF: we hold a write end)
    std::string_view chunk(buffer, static_cast<size_t>(n));
    while (!chunk.empty()) {
      const size_t newline = chunk.find('\n');
      const std::string_view piece = chunk.substr(0, newline);
      if (!skipping_) partial_.append(piece);
      if (partial_.size() > PIPE_BUF) {
        partial_.clear();
        skipping_ = true;
      }
      if (newline == std::string_view::npos) break;
      chunk.remove_prefix(newline + 1);
      if (skipping_) {
        skipping_ = false;
        on_line("");
      } else {
        on_line(partial_);
        partial_.clear();
      }
    }
  }
}

}  // namespace muster
