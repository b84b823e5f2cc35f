// Munge credentials, as Slurm uses them: a process asks its host's munged
// for a credential that says which uid and gid it runs as, and any host of
// the same munge key can check it (through its own munged) without a shared
// secret of the job's. Inside a Slurm allocation munged runs on every node,
// so muster's agents prove who they are with no flag.
//
// A credential decodes once (munged refuses a replay) and for a few minutes
// (its time-to-live): a client encodes a fresh one per call.
#ifndef MUSTER_RENDEZVOUS_AUTH_MUNGE_H_
#define MUSTER_RENDEZVOUS_AUTH_MUNGE_H_

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muster::rdzv {

// The metadata a rendezvous call carries its credential in (Join, Status,
// ReportFailure, ReportDone, Leave), and the uid a Heartbeat or Watch
// claims (a claim only: the node's secret authorizes those).
inline constexpr absl::string_view kMungeMetadataKey = "x-muster-munge";
inline constexpr absl::string_view kUidMetadataKey = "x-muster-uid";

struct MungeOptions {
  // munged's socket; empty: libmunge's default (/run/munge/munge.socket.2).
  std::string socket;
};

// libmunge's default socket path.
std::string DefaultMungeSocket();

// Whether a munged socket is there to ask (a socket file at the path); says
// nothing of whether munged answers.
bool MungeSocketPresent(const MungeOptions& options);

// A new credential for this process's uid and gid, with no payload.
// Errors: kUnavailable munged cannot be reached (the message names the
// socket); kInternal anything else munged says.
absl::StatusOr<std::string> EncodeMungeCredential(const MungeOptions& options);

struct MungeIdentity {
  uid_t uid = 0;
  gid_t gid = 0;
};

// Who `credential` says its maker is. Errors: kUnauthenticated the
// credential is not valid here (forged, expired, replayed, from another
// key); kUnavailable munged cannot be reached.
absl::StatusOr<MungeIdentity> DecodeMungeCredential(const std::string& credential,
                                                    const MungeOptions& options);

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_AUTH_MUNGE_H_
