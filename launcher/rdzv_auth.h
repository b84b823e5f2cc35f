// Which credential a launch's rendezvous uses: the choice, from what was
// asked and what the host offers. Pure: the caller looks at the token file
// and munged's socket.
#ifndef MUSTER_LAUNCHER_RDZV_AUTH_H_
#define MUSTER_LAUNCHER_RDZV_AUTH_H_

#include <string>

#include "absl/status/statusor.h"
#include "agent/config.h"

namespace muster {

struct AuthFacts {
  RdzvAuth asked = RdzvAuth::kAuto;  // --rdzv-conf auth=
  bool token_file = false;           // a token file was given (token_file=, MUSTER_TOKEN_FILE)
  bool in_slurm = false;             // Slurm's allocation gave the defaults
  bool munge_socket_present = false;
  std::string munge_socket;  // the socket looked at, for messages
};

// kNone, kToken or kMunge. kAuto: a token file wins (the token), else munge
// inside a Slurm allocation whose host runs munged, else none. An explicit
// choice is taken as it is, or refused: auth=token without a token file,
// auth=munge with no munged socket (the message names it), auth=none or
// munge with a token file (which would be ignored). Errors:
// kInvalidArgument, one line that names the fix.
absl::StatusOr<RdzvAuth> ChooseRdzvAuth(const AuthFacts& facts);

}  // namespace muster

#endif  // MUSTER_LAUNCHER_RDZV_AUTH_H_
