// A member of the job's own etcd cluster (host mode's HA, --rdzv-conf
// ha=1), run by this node's agent: Debian's etcd as a child that dies with
// the agent (PR_SET_PDEATHSIG), its data and log in a directory of the
// job's own (mode 0700), listening on the node's address only. Losing the
// node loses its member, as a real node loss would; etcd's raft keeps the
// job's state on the members left (rendezvous/etcd/members.h picks who
// replaces it).
//
// The agent reaps every child that exits (its subreaper loop), this one
// too: the member's own thread holds a pidfd, which names it whoever reaps
// it, so no signal can reach a process that took its pid.
#ifndef MUSTER_LAUNCHER_ETCD_MEMBER_H_
#define MUSTER_LAUNCHER_ETCD_MEMBER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/unique_handle.h"
#include "rendezvous/etcd/backend.h"

namespace muster {

struct EtcdMemberOptions {
  std::string etcd;       // the etcd executable
  std::string name;       // the member's name in the cluster
  std::string directory;  // made (0700) if missing; holds data/ and etcd.log
  std::string host;       // the address it listens on and advertises
  int client_port = 0;    // 0: a free one
  int peer_port = 0;      // 0: a free one
  // --initial-cluster-token: members of one job's cluster only.
  std::string cluster_token;
  // Where the lock of a given client port lives (Start).
  std::string lock_directory = "/tmp";
  bool fixed_port = false;  // set by Create: client_port was given
};

class EtcdMember {
 public:
  // Picks the free ports; starts nothing. Errors: no free port.
  static absl::StatusOr<std::unique_ptr<EtcdMember>> Create(EtcdMemberOptions options);

  // Stops the member (SIGTERM, then SIGKILL after 5 s), reaps it, and
  // deletes its directory.
  ~EtcdMember();
  EtcdMember(const EtcdMember&) = delete;
  EtcdMember& operator=(const EtcdMember&) = delete;

  const std::string& name() const { return options_.name; }
  std::string client_url() const;
  std::string peer_url() const;
  std::string endpoint() const;  // "host:client_port"

  // Starts etcd: the first member of a new cluster (`initial_cluster`
  // empty), or a member the cluster added already (etcd's member add),
  // joining `initial_cluster` ("name=peer_url,..."). Returns once its
  // client port accepts connections, or an error (etcd exited: the end of
  // its log; not listening within `timeout`). With a client port given,
  // agents of one host start one at a time (a lock file), and one whose
  // port another process holds is refused: kAlreadyExists. Once only: a second call is
  // refused (kFailedPrecondition).
  absl::Status Start(const std::string& initial_cluster, absl::Duration timeout);

  // Whether the process runs (started and not exited), and whether it ran
  // and exited.
  bool running() const ABSL_LOCKS_EXCLUDED(mu_);
  bool exited() const ABSL_LOCKS_EXCLUDED(mu_);
  // The end of etcd's log, for messages.
  std::string LogTail() const;
  // Sends `sig` to the member; nothing once it has exited.
  void Signal(int sig) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit EtcdMember(EtcdMemberOptions options) : options_(std::move(options)) {}
  // Waits for the child on its own thread (it was started there).
  void Supervise(std::vector<std::string> argv);

  const EtcdMemberOptions options_;
  std::thread thread_;
  mutable absl::Mutex mu_;
  pid_t pid_ ABSL_GUARDED_BY(mu_) = 0;  // for messages
  UniqueFd pidfd_ ABSL_GUARDED_BY(mu_);
  bool spawned_ ABSL_GUARDED_BY(mu_) = false;  // the thread tried
  bool exited_ ABSL_GUARDED_BY(mu_) = false;
  std::string spawn_error_ ABSL_GUARDED_BY(mu_);
};

// `member` as the etcd backend's MemberHost: offered under `host_name`,
// started on a thread of its own when the node is seated (the first
// member, started already, is seated). Stopped when the last holder lets go.
std::shared_ptr<etcd::MemberHost> NewMemberHost(std::unique_ptr<EtcdMember> member,
                                                std::string host_name);

}  // namespace muster

#endif  // MUSTER_LAUNCHER_ETCD_MEMBER_H_
