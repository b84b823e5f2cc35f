#include "tests/support/etcd_test_cluster.h"

#include <stdio.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace muster::etcd {

absl::StatusOr<std::string> Shell(const std::string& command, absl::Duration timeout) {
  const std::string bounded =
      absl::StrCat("timeout -k 5 ", absl::ToInt64Seconds(timeout), " sh -c '", command, "' 2>&1");
  FILE* pipe = ::popen(bounded.c_str(), "r");
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

TestCluster::~TestCluster() {
  if (dir_ != nullptr) {
    if (absl::Status stopped = Stop(false); !stopped.ok()) {
      std::fprintf(stderr, "%s\n", stopped.ToString().c_str());
    }
  }
}

void TestCluster::Start(const std::string& tls_dir) {
  if (::access(kEtcd, X_OK) != 0 || ::access(kEtcdctl, X_OK) != 0) {
    skip_ = absl::StrCat(kEtcd, " or ", kEtcdctl,
                         " is not installed (etcd-server, etcd-client: scripts/setup)");
    return;
  }
  // The process adopts the members it outlives, to reap them in Stop:
  // where PID 1 does not reap, they would stay zombies.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  dir_ = std::make_unique<support::TempDir>("muster-etcd");
  tls_dir_ = tls_dir;
  absl::StatusOr<std::string> started =
      Shell(absl::StrCat("ETCD_CLUSTER_OWNER_PID=", ::getpid(), " ETCD_CLUSTER_TLS_DIR=", tls_dir_,
                         " ", MUSTER_ETCD_CLUSTER_SCRIPT, " start ", dir_->path()));
  if (!started.ok()) {
    status_ = started.status();
    return;
  }
  endpoints_ = absl::StrSplit(*started, ',');
}

absl::Status TestCluster::Stop(bool keep) {
  if (dir_ == nullptr) return absl::OkStatus();
  absl::StatusOr<std::string> stopped = Script("stop");
  for (int i = 0; i < 100 && ::waitpid(-1, nullptr, WNOHANG) > 0; ++i) {
  }
  if (keep) dir_->Keep();
  dir_.reset();
  return stopped.status();
}

absl::StatusOr<std::string> TestCluster::Script(const std::string& command,
                                                const std::string& args) const {
  const std::string dir = dir_ != nullptr ? dir_->path() : "";
  return Shell(absl::StrCat(MUSTER_ETCD_CLUSTER_SCRIPT, " ", command, " ", dir, " ", args));
}

absl::StatusOr<std::string> TestCluster::Etcdctl(const std::string& args) const {
  const std::string tls = tls_dir_.empty()
                              ? ""
                              : absl::StrCat(" --cacert ", tls_dir_, "/ca.pem --cert ", tls_dir_,
                                             "/client.pem --key ", tls_dir_, "/client.key");
  return Shell(absl::StrCat("ETCDCTL_API=3 ", kEtcdctl, tls, " --endpoints ",
                            absl::StrJoin(endpoints_, ","), " ", args));
}

std::vector<int> TestCluster::MemberPids() const {
  std::vector<int> pids;
  if (dir_ == nullptr) return pids;
  for (int n = 0; n < 3; ++n) {
    std::ifstream file(dir_->Path(absl::StrCat("m", n, ".pid")));
    int pid = 0;
    if (file >> pid) pids.push_back(pid);
  }
  return pids;
}

}  // namespace muster::etcd
