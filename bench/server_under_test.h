// The rendezvous server the scale bench measures, wherever it runs: a child
// process of its own (this binary re-executed with --serve), so that its RSS
// and CPU are its own; this process; or a musterd started by hand (--connect).
#ifndef MUSTER_BENCH_SERVER_UNDER_TEST_H_
#define MUSTER_BENCH_SERVER_UNDER_TEST_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rendezvous/server/service.h"

namespace muster::rdzv::scale {

// Keeps the server's jobs in `dir`, as musterd --state-dir does: opens
// DIR/journal (made if missing), restores what it holds and rides out
// outages; a journal that fails later is reported on stderr (the hub then
// stops, and the run fails).
absl::Status KeepStateIn(const std::string& dir, ServerOptions* options);

// --serve: the child's whole life. Listens on 127.0.0.1:`port` (0: any),
// with its state kept in `state_dir` unless empty; prints the port on
// stdout, serves until stdin reaches EOF (the parent closed it, or died) or
// `limit` runs out. Returns the exit code.
int ServeMain(absl::Duration limit, bool deadlock_detection, ServerOptions options, int port,
              const std::string& state_dir);

// When a server was killed and its successor started (KillAndRestart).
struct RestartTimes {
  std::chrono::steady_clock::time_point killed;     // SIGKILL sent
  std::chrono::steady_clock::time_point spawned;    // the new child spawned
  std::chrono::steady_clock::time_point listening;  // it reported its port
};

// Where the server runs and how to read its figures. Dropping it stops a
// server it started.
class ServerUnderTest {
 public:
  virtual ~ServerUnderTest() = default;
  virtual std::string target() const = 0;
  // The process whose CPU and peak RSS are the server's.
  virtual pid_t pid() const = 0;
  // SIGKILLs the server and starts another on the same port and state
  // directory, returning once it listens. kFailedPrecondition where the
  // server is not a child process with a state directory.
  virtual absl::Status KillAndRestart(RestartTimes* times) = 0;
};

// Where the flags put the server.
struct ServerPlace {
  std::string mode = "child";  // "child" or "in-process"
  std::string connect;         // HOST:PORT of a running server; it overrides `mode`
  pid_t connect_pid = 0;       // with `connect`: that server's pid
};

// A server for one run, as `place` says: a fresh one with `options` (a child
// lives at most `limit`, and keeps Abseil's deadlock detection where
// `deadlock_detection`; its jobs are kept in `state_dir` unless that is
// empty), or the one at place.connect, shared by every run.
absl::StatusOr<std::unique_ptr<ServerUnderTest>> StartServerUnderTest(const ServerPlace& place,
                                                                      const ServerOptions& options,
                                                                      absl::Duration limit,
                                                                      bool deadlock_detection,
                                                                      const std::string& state_dir);

// A fresh directory for one run's journal, made in `parent` (made too if
// missing); removed, with what a server left in it, when dropped.
// REQUIRES: no server uses it any more when it is dropped.
class ScratchStateDir {
 public:
  static absl::StatusOr<ScratchStateDir> Make(const std::string& parent, const std::string& prefix);
  ScratchStateDir(ScratchStateDir&& other) noexcept : path_(std::move(other.path_)) {
    other.path_.clear();
  }
  ScratchStateDir& operator=(ScratchStateDir&&) = delete;
  ~ScratchStateDir();

  const std::string& path() const { return path_; }
  // The journal's size now; -1 if there is none.
  int64_t JournalBytes() const;

 private:
  explicit ScratchStateDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// What one durable append costs on the file system under `dir`: the median
// time, in ms, of `count` 256-byte appends each followed by fdatasync (the
// journal's unit of work), in a scratch file removed after.
absl::StatusOr<double> FdatasyncMs(const std::string& dir, int count);

}  // namespace muster::rdzv::scale

#endif  // MUSTER_BENCH_SERVER_UNDER_TEST_H_
