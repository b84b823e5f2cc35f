// The rendezvous server the scale bench measures, wherever it runs: a child
// process of its own (this binary re-executed with --serve), so that its RSS
// and CPU are its own; this process; or a musterd started by hand (--connect).
#ifndef MUSTER_BENCH_SERVER_UNDER_TEST_H_
#define MUSTER_BENCH_SERVER_UNDER_TEST_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rendezvous/service.h"

namespace muster::rdzv::scale {

// --serve: the child's whole life. Prints the port on stdout, serves until
// stdin reaches EOF (the parent closed it, or died) or `limit` runs out.
// Returns the exit code.
int ServeMain(absl::Duration limit, bool deadlock_detection, const ServerOptions& options);

// Where the server runs and how to read its figures. Dropping it stops a
// server it started.
class ServerUnderTest {
 public:
  virtual ~ServerUnderTest() = default;
  virtual std::string target() const = 0;
  // The process whose CPU and peak RSS are the server's.
  virtual pid_t pid() const = 0;
};

// Where the flags put the server.
struct ServerPlace {
  std::string mode = "child";  // "child" or "in-process"
  std::string connect;         // HOST:PORT of a running server; it overrides `mode`
  pid_t connect_pid = 0;       // with `connect`: that server's pid
};

// A server for one run, as `place` says: a fresh one with `options` (a child
// lives at most `limit`, and keeps Abseil's deadlock detection where
// `deadlock_detection`), or the one at place.connect, shared by every run.
absl::StatusOr<std::unique_ptr<ServerUnderTest>> StartServerUnderTest(const ServerPlace& place,
                                                                      const ServerOptions& options,
                                                                      absl::Duration limit,
                                                                      bool deadlock_detection);

}  // namespace muster::rdzv::scale

#endif  // MUSTER_BENCH_SERVER_UNDER_TEST_H_
