#include "launcher/rdzv_auth.h"

#include "absl/strings/str_cat.h"

namespace muster {

absl::StatusOr<RdzvAuth> ChooseRdzvAuth(const AuthFacts& facts) {
  switch (facts.asked) {
    case RdzvAuth::kAuto:
      if (facts.token_file) return RdzvAuth::kToken;
      if (facts.in_slurm && facts.munge_socket_present) return RdzvAuth::kMunge;
      return RdzvAuth::kNone;
    case RdzvAuth::kToken:
      if (facts.token_file) return RdzvAuth::kToken;
      return absl::InvalidArgumentError(
          "--rdzv-conf auth=token needs a token file: give token_file=PATH (or "
          "MUSTER_TOKEN_FILE=PATH)");
    case RdzvAuth::kNone:
    case RdzvAuth::kMunge: {
      const char* asked = facts.asked == RdzvAuth::kNone ? "none" : "munge";
      if (facts.token_file) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--rdzv-conf auth=", asked,
            " and a token file (token_file= or MUSTER_TOKEN_FILE) contradict each other; drop "
            "one"));
      }
      if (facts.asked == RdzvAuth::kNone) return RdzvAuth::kNone;
      if (facts.munge_socket_present) return RdzvAuth::kMunge;
      return absl::InvalidArgumentError(
          absl::StrCat("--rdzv-conf auth=munge, but no munged socket at ", facts.munge_socket,
                       "; start munged (systemctl start munge), or give munge_socket=PATH"));
    }
  }
  return RdzvAuth::kNone;
}

}  // namespace muster
