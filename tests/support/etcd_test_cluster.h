// A real 3-member etcd cluster (tests/etcd/cluster.sh on free loopback
// ports) in a directory of its own, for a test process or a benchmark; the
// script's watchdog stops it if the process dies first. No gtest here:
// etcd_cluster.h has the suites built on it.
#ifndef MUSTER_TESTS_SUPPORT_ETCD_TEST_CLUSTER_H_
#define MUSTER_TESTS_SUPPORT_ETCD_TEST_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/support/temp_dir.h"

namespace muster::etcd {

inline constexpr char kEtcd[] = "/usr/bin/etcd";
inline constexpr char kEtcdctl[] = "/usr/bin/etcdctl";

// Runs `command` with sh, ended after `timeout` (coreutils' timeout); its
// output (stdout and stderr, trimmed), or an error that quotes it.
absl::StatusOr<std::string> Shell(const std::string& command,
                                  absl::Duration timeout = absl::Minutes(2));

class TestCluster {
 public:
  TestCluster() = default;
  TestCluster(const TestCluster&) = delete;
  TestCluster& operator=(const TestCluster&) = delete;
  // Stop(false), if it runs.
  ~TestCluster();

  // Starts it; with `tls_dir`, over mutual TLS with the files
  // tests/support/certificates.h makes there. Sets skip() or status().
  void Start(const std::string& tls_dir = "");
  // Stops it, and removes its directory unless `keep` (a failed run's logs).
  // The script's error, if it gave one.
  absl::Status Stop(bool keep);

  // Why it cannot run here (etcd is not installed); empty: it can.
  const std::string& skip() const { return skip_; }
  const absl::Status& status() const { return status_; }
  const std::vector<std::string>& endpoints() const { return endpoints_; }

  // tests/etcd/cluster.sh COMMAND DIR ARGS.
  absl::StatusOr<std::string> Script(const std::string& command,
                                     const std::string& args = "") const;
  // etcdctl (v3) against the members, with the client certificate under TLS.
  absl::StatusOr<std::string> Etcdctl(const std::string& args) const;
  // The members' pids, as the script wrote them.
  std::vector<int> MemberPids() const;

 private:
  std::string skip_;
  absl::Status status_;
  std::unique_ptr<support::TempDir> dir_;
  std::string tls_dir_;
  std::vector<std::string> endpoints_;
};

}  // namespace muster::etcd

#endif  // MUSTER_TESTS_SUPPORT_ETCD_TEST_CLUSTER_H_
