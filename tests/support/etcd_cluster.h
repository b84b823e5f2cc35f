// A real 3-member etcd cluster for a test process (tests/etcd/cluster.sh on
// free loopback ports), gone with the process however that ends: skipped
// where etcd-server or etcd-client is not installed.
#ifndef MUSTER_TESTS_SUPPORT_ETCD_CLUSTER_H_
#define MUSTER_TESTS_SUPPORT_ETCD_CLUSTER_H_

#include <stdio.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "rendezvous/etcd/client.h"

namespace muster::etcd {

inline constexpr char kEtcd[] = "/usr/bin/etcd";
inline constexpr char kEtcdctl[] = "/usr/bin/etcdctl";

// Runs `command` in a shell; its output (stdout and stderr), or an error
// that quotes it.
inline absl::StatusOr<std::string> Shell(const std::string& command) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return absl::InternalError(absl::StrCat("popen: ", command));
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = ::fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
  const int status = ::pclose(pipe);
  if (status != 0) {
    return absl::InternalError(absl::StrCat(command, " exited ", status, ":\n", output));
  }
  return std::string(absl::StripAsciiWhitespace(output));
}

// A cluster of tests/etcd/cluster.sh in a directory of its own, gone with
// the test process however that ends (the script's watchdog).
class TestCluster {
 public:
  // Starts it; with `tls_dir`, over mutual TLS with the files
  // test_certificates.h makes there. Sets skip() or status().
  void Start(const std::string& tls_dir = "") {
    if (::access(kEtcd, X_OK) != 0 || ::access(kEtcdctl, X_OK) != 0) {
      skip_ = absl::StrCat(kEtcd, " or ", kEtcdctl,
                           " is not installed (etcd-server, etcd-client: scripts/setup)");
      return;
    }
    // The process adopts the members it outlives, to reap them in Stop:
    // where PID 1 does not reap, they would stay zombies.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    char pattern[] = "/tmp/muster-etcd-XXXXXX";
    if (::mkdtemp(pattern) == nullptr) {
      status_ = absl::InternalError("mkdtemp failed");
      return;
    }
    dir_ = pattern;
    tls_dir_ = tls_dir;
    absl::StatusOr<std::string> started = Shell(
        absl::StrCat("ETCD_CLUSTER_OWNER_PID=", ::getpid(), " ETCD_CLUSTER_TLS_DIR=", tls_dir_, " ",
                     MUSTER_ETCD_CLUSTER_SCRIPT, " start ", dir_));
    if (!started.ok()) {
      status_ = started.status();
      return;
    }
    endpoints_ = absl::StrSplit(*started, ',');
  }

  // Stops it, and removes its directory unless `keep` (a failed test's logs).
  void Stop(bool keep) {
    if (dir_.empty()) return;
    absl::StatusOr<std::string> stopped = Script("stop");
    EXPECT_TRUE(stopped.ok()) << stopped.status();
    for (int i = 0; i < 100 && ::waitpid(-1, nullptr, WNOHANG) > 0; ++i) {
    }
    if (keep) {
      std::fprintf(stderr, "etcd logs kept in %s\n", dir_.c_str());
    } else {
      std::error_code ignored;
      std::filesystem::remove_all(dir_, ignored);
    }
    dir_.clear();
  }

  // Why the tests cannot run here; empty: they can.
  const std::string& skip() const { return skip_; }
  const absl::Status& status() const { return status_; }
  const std::vector<std::string>& endpoints() const { return endpoints_; }

  // tests/etcd/cluster.sh COMMAND DIR ARGS.
  absl::StatusOr<std::string> Script(const std::string& command,
                                     const std::string& args = "") const {
    return Shell(absl::StrCat(MUSTER_ETCD_CLUSTER_SCRIPT, " ", command, " ", dir_, " ", args));
  }
  absl::StatusOr<std::string> Etcdctl(const std::string& args) const {
    const std::string tls = tls_dir_.empty()
                                ? ""
                                : absl::StrCat(" --cacert ", tls_dir_, "/ca.pem --cert ", tls_dir_,
                                               "/client.pem --key ", tls_dir_, "/client.key");
    return Shell(absl::StrCat("ETCDCTL_API=3 ", kEtcdctl, tls, " --endpoints ",
                              absl::StrJoin(endpoints_, ","), " ", args));
  }

 private:
  std::string skip_;
  absl::Status status_;
  std::string dir_;
  std::string tls_dir_;
  std::vector<std::string> endpoints_;
};

inline bool SuiteFailed() {
  const ::testing::TestSuite* suite = ::testing::UnitTest::GetInstance()->current_test_suite();
  return suite != nullptr && suite->Failed();
}

// A suite on one plaintext cluster for the test process (ctest runs one
// test per process). A test that derives from it and has a SetUp of its own
// calls this one first, and returns if it skipped or failed.
class PlaintextClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_.Start(); }
  static void TearDownTestSuite() { cluster_.Stop(SuiteFailed()); }

  // Skips the test where etcd is not installed; fails it where the cluster
  // did not start.
  void SetUp() override {
    if (!cluster_.skip().empty()) GTEST_SKIP() << cluster_.skip();
    ASSERT_TRUE(cluster_.status().ok()) << cluster_.status();
  }
  bool SetUpStopped() const { return IsSkipped() || HasFatalFailure(); }

  // A client's options for the cluster.
  static EtcdOptions Options() {
    EtcdOptions options;
    options.endpoints = cluster_.endpoints();
    return options;
  }

  static inline TestCluster cluster_;
};

}  // namespace muster::etcd

#endif  // MUSTER_TESTS_SUPPORT_ETCD_CLUSTER_H_
