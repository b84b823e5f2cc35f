// A small client of etcd's v3 gRPC API, for --rdzv-backend etcd: the
// key-value calls, leases kept alive, and watches, spoken with muster's own
// gRPC from etcd's protos (proto/etcd/).
//
// Failover: the client keeps one gRPC channel per member and sends every
// call to one member at a time. A call that fails for a reason another
// member may not have (no connection, member without a leader, no answer
// within attempt_timeout) is tried on the next member, round the list, with
// a short backoff once every member has failed, all within the call's
// deadline; later calls start at the member that answered. Streams (lease
// keep-alives, watches) reopen on the next member in the same way.
#ifndef MUSTER_RENDEZVOUS_ETCD_CLIENT_H_
#define MUSTER_RENDEZVOUS_ETCD_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "etcd/etcdserver/etcdserverpb/rpc.pb.h"
#include "etcd/mvcc/mvccpb/kv.pb.h"
#include "rendezvous/auth/tls_files.h"

namespace muster::etcd {

// The port an etcd endpoint without one has.
inline constexpr int kDefaultEtcdPort = 2379;

struct EtcdOptions {
  // The members, "host:port" (IPv6 in brackets), as ParseEtcdEndpoints
  // writes them. At least one. Calls start at the first: shuffle the list
  // to spread many clients over the members.
  std::vector<std::string> endpoints;
  // Empty user: no authentication. Else Auth.Authenticate with these, on the
  // first call, and the token in every call's `token` metadata. A member
  // whose authentication is not on yet (a cluster being set up) is asked
  // again within the call's deadline.
  std::string user, password;
  // Empty: plaintext. Else TLS (rendezvous/auth/tls.h): tls.cacert is required,
  // the members' certificates must name the host of their endpoint, and
  // tls.cert with tls.key, when given, is presented to them.
  rdzv::TlsFiles tls;
  // Each call's deadline, all its attempts included.
  absl::Duration call_timeout = absl::Seconds(5);
  // An attempt that has no answer after this is given up, and the call goes
  // on at the next member (where repeating it is safe, see EtcdClient): a
  // write sent to a follower just as the leader died is lost in etcd and
  // would otherwise be answered only after etcd's own 5 s or more.
  absl::Duration attempt_timeout = absl::Seconds(1);
  // With a positive interval, the client asks etcd for its members this
  // often and from then on calls the voters it lists (SetEndpoints): a
  // cluster whose members change (host mode's own, etcd/members.h) is
  // followed, as etcd's own clients' --auto-sync-interval does.
  absl::Duration auto_sync_interval = absl::ZeroDuration();
  // The largest response the client accepts (gRPC's receive limit; gRPC's
  // default is 4 MiB). GetPrefix pages below it.
  int max_response_bytes = 64 << 20;
};

struct EtcdEndpoints {
  std::vector<std::string> endpoints;  // "host:port", "[v6]:port"
  // The entries were written https://: the caller should give TLS files
  // (EtcdOptions::tls); without them the client would speak plaintext.
  bool tls = false;
};

// Parses a comma-separated list of etcd endpoints, each HOST[:PORT] or
// [IPV6][:PORT] (the port defaults to kDefaultEtcdPort), optionally preceded
// by http:// or https:// (the same for every entry) and followed by a "/".
// Pure. Errors: kInvalidArgument naming the bad entry and what is wrong with
// it (empty list or entry, other scheme, a path, no host, a bad port, an
// IPv6 address without brackets, an entry given twice, http and https mixed).
absl::StatusOr<EtcdEndpoints> ParseEtcdEndpoints(absl::string_view text);

// The range_end that, with key `prefix`, covers every key starting with
// `prefix`: the prefix with its last byte below 0xff incremented and what
// follows dropped; "\0" (every key from `prefix` on) when there is no such
// byte (an empty prefix, or all 0xff).
std::string PrefixEnd(absl::string_view prefix);

struct GetResult {
  std::optional<mvccpb::KeyValue> kv;  // unset: no such key
  int64_t revision = 0;                // the store's revision the read saw
};

struct RangeResult {
  std::vector<mvccpb::KeyValue> kvs;  // in key order
  int64_t revision = 0;               // every page was read at this revision
};

// Keeps a lease alive (EtcdClient::KeepAlive). Destroying it stops the
// keep-alives (the lease then expires after its TTL) and returns only when
// none of its callbacks runs or can run any more (with a user, that can
// include an authentication under way: up to call_timeout).
// REQUIRES: not destroyed from inside its own on_lost.
class LeaseKeeper {
 public:
  virtual ~LeaseKeeper() = default;
};

// A watch (EtcdClient::Watch). Destroying it ends the watch without calling
// on_end, and returns only when none of its callbacks runs or can run any
// more (as LeaseKeeper's). REQUIRES: not destroyed from inside its own
// on_events or on_end.
class EtcdWatch {
 public:
  virtual ~EtcdWatch() = default;
};

// etcd's client URL ("http://10.0.0.1:2379") as an endpoint ("10.0.0.1:2379");
// nullopt for one that is not http(s)://HOST:PORT.
std::optional<std::string> EndpointOfUrl(absl::string_view url);

// A transaction applied only while `key` is the one created at
// `create_revision`: a leader's writes, void once its key is gone (its
// lease ended) or was made anew by another agent. The caller adds the ops.
etcdserverpb::TxnRequest FencedTxn(const std::string& key, int64_t create_revision);

// What answers at `target` ("host:port", plaintext) within `timeout`: an
// etcd member (any answer to etcd's Maintenance.Status, a refusal for want
// of credentials included), a gRPC server without etcd's services (muster's
// own rendezvous: UNIMPLEMENTED), or nothing yet (no answer, or one that
// says neither).
enum class EndpointServes { kNothingYet, kEtcd, kOther };
EndpointServes ProbeEndpoint(const std::string& target, absl::Duration timeout);

// Thread-safe: calls may come from any threads at once. Keepers and watches
// may outlive the client that made them.
//
// Errors carry etcd's message (e.g. "etcdserver: requested lease not found")
// and gRPC's code (kNotFound there), with the call and the member added.
// When no member answered within call_timeout, the call ends kUnavailable.
//
// Blocking calls are repeated on another member only where that is safe:
// reads, Put (a repeated Put that had been applied writes the same value
// again, at a new revision: watchers see it twice), Delete and DeletePrefix
// (the count may miss keys that an abandoned attempt deleted), GrantLease
// (the client chooses the lease id, so a repeat finds its own lease) and
// RevokeLease (a repeat that finds the lease gone succeeds). A Txn with
// writes is repeated only when etcd cannot have received it (no
// connection, or a member without a leader); if an attempt was sent and no
// answer came, Txn ends kUnavailable saying that it may have been applied:
// the caller re-reads and decides.
class EtcdClient {
 public:
  // Checks the options and makes the channels; connects to nothing yet.
  // Errors: kInvalidArgument (no endpoint, timeouts not positive, TLS files
  // that cannot be used, see rdzv::ClientTlsCredentials).
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(EtcdOptions options);

  virtual ~EtcdClient() = default;

  // Puts `value` at `key`, attached to `lease` (0: none). Returns the
  // revision of the write.
  virtual absl::StatusOr<int64_t> Put(absl::string_view key, absl::string_view value,
                                      int64_t lease = 0) = 0;
  // A linearizable read of one key.
  virtual absl::StatusOr<GetResult> Get(absl::string_view key) = 0;
  // Every key starting with `prefix` (all keys for ""), read in pages of at
  // most 1000 keys (fewer when a page would exceed max_response_bytes), all
  // at the revision of the first page. Each page has its own call_timeout.
  virtual absl::StatusOr<RangeResult> GetPrefix(absl::string_view prefix) = 0;
  // Return how many keys were deleted. An empty prefix is refused
  // (kInvalidArgument): it would be every key in etcd.
  virtual absl::StatusOr<int64_t> Delete(absl::string_view key) = 0;
  virtual absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix) = 0;
  // One transaction; `succeeded` in the response tells which branch ran.
  virtual absl::StatusOr<etcdserverpb::TxnResponse> Txn(
      const etcdserverpb::TxnRequest& request) = 0;
  // A new lease of `ttl`, rounded up to whole seconds (etcd may grant more,
  // its minimum being 1.5 election timeouts). Returns its id.
  virtual absl::StatusOr<int64_t> GrantLease(absl::Duration ttl) = 0;
  // Ends the lease and deletes its keys. kNotFound: no such lease.
  virtual absl::Status RevokeLease(int64_t lease) = 0;
  // Every lease etcd holds, of anyone (etcd's LeaseLeases).
  virtual absl::StatusOr<std::vector<int64_t>> Leases() = 0;

  // The cluster's membership (etcd's Cluster service). MemberAdd is sent
  // once where it may have been applied (as a Txn with writes): the caller
  // lists the members to know. MemberPromote fails (kFailedPrecondition)
  // until the learner has caught up with the leader.
  virtual absl::StatusOr<std::vector<etcdserverpb::Member>> MemberList() = 0;
  virtual absl::StatusOr<etcdserverpb::Member> MemberAdd(absl::string_view peer_url,
                                                         bool learner) = 0;
  virtual absl::Status MemberRemove(uint64_t id) = 0;
  virtual absl::Status MemberPromote(uint64_t id) = 0;
  // Turns etcd's authentication on, with the user `root` (etcd's root
  // role) and `password`: the first member of host mode's own cluster,
  // before anyone else reaches it. Needs a client without a user. Safe to
  // repeat (a user that exists, auth that is on, are fine).
  virtual absl::Status EnableRootAuth(absl::string_view password) = 0;
  // Calls and new streams go to these members ("host:port") from now on;
  // streams open elsewhere stay there until they break. Empty: no change.
  virtual void SetEndpoints(const std::vector<std::string>& endpoints) = 0;
  // The members calls go to now (those SetEndpoints retired left out).
  virtual std::vector<std::string> Endpoints() const = 0;

  // Keeps `lease` (granted with `ttl`) alive over one LeaseKeepAlive stream:
  // a keep-alive at once and then every ttl / 3. A stream that breaks, or
  // whose keep-alive has no answer by the next one, is reopened on the next
  // member. `on_lost` runs at most once, on a gRPC thread, when the lease is
  // gone (etcd answers TTL 0: kNotFound) or no keep-alive succeeded for a
  // whole `ttl` (kDeadlineExceeded, with the last error); the keeper stops
  // there. It may still be starting as the keeper's destructor begins; the
  // destructor returns after it has returned. REQUIRES: ttl >= 1 s.
  virtual std::unique_ptr<LeaseKeeper> KeepAlive(int64_t lease, absl::Duration ttl,
                                                 std::function<void(absl::Status)> on_lost) = 0;

  // Watches `key` (range_end empty), or the keys in [key, range_end)
  // (PrefixEnd(prefix) for a prefix), for changes from `start_revision`.
  // The watch opens asynchronously: 0 means from the revision the member is
  // at when it opens, some time after Watch returns; to miss nothing, pass
  // the revision of a read or write of yours + 1.
  //
  // `on_events` gets each batch of events in revision order, with the
  // revision of the store when etcd sent it; calls never overlap. A stream
  // that breaks (a member killed, or left without a leader) is reopened on
  // the next member from the revision after the last event delivered, with
  // a backoff of 50 ms to 1 s between attempts that fail at once, for as
  // long as it takes: no event is lost or repeated.
  //
  // `on_end` runs at most once, and then nothing more does, when the watch
  // ends for good: kOutOfRange when the revision to watch from has been
  // compacted (the message gives the compact revision: re-read with
  // GetPrefix and watch from its revision + 1; this can also happen to a
  // watch that saw no event for long and reopens after a compaction);
  // etcd's reason when it cancels the watch (kPermissionDenied,
  // kFailedPrecondition); an error every member would give (a response over
  // max_response_bytes: kResourceExhausted; a password etcd refuses). An
  // outage of any length is not an end. Destroying the watch does not call
  // it (as for on_lost, one starting just then is waited for).
  //
  // Both run on gRPC threads and should return quickly: the stream reads
  // its next response only after on_events returns.
  virtual std::unique_ptr<EtcdWatch> Watch(
      std::string key, std::string range_end, int64_t start_revision,
      std::function<void(const std::vector<mvccpb::Event>&, int64_t revision)> on_events,
      std::function<void(absl::Status)> on_end) = 0;
};

}  // namespace muster::etcd

#endif  // MUSTER_RENDEZVOUS_ETCD_CLIENT_H_
