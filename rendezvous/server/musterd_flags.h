// musterd's command line: what it asks for, checked, with no file read and
// no socket opened (musterd.cc's Run does those). Unit-tested as
// launcher/options is.
#ifndef MUSTER_RENDEZVOUS_SERVER_MUSTERD_FLAGS_H_
#define MUSTER_RENDEZVOUS_SERVER_MUSTERD_FLAGS_H_

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rendezvous/auth/tls_files.h"

namespace muster::rdzv {

inline constexpr int kMusterdExitSuccess = 0;
inline constexpr int kMusterdExitCannotServe = 1;
inline constexpr int kMusterdExitUsage = 2;

struct MusterdConfig {
  std::string listen = "0.0.0.0";  // an address, without brackets
  int port = 0;                    // 0: a free one
  std::string token_file;          // empty: no token
  TlsFiles tls;                    // cert and key both or neither; cacert needs them
  bool munge = false;
  std::string munge_socket;  // empty: libmunge's default
  std::string state_dir;     // empty: jobs are not kept
  absl::Duration ping_interval;
  absl::Duration ping_timeout;
  absl::Duration max_join_timeout;
  absl::Duration drain;  // zero: none
  size_t max_jobs = 0;
  std::string event_log;                     // empty: none
  std::optional<int> metrics_port;           // unset: no metrics
  std::string metrics_listen = "127.0.0.1";  // an IPv4 address
  std::string metrics_password_file;         // empty: the token's rules (auth/metrics_password.h)
};

struct ParsedMusterdFlags {
  MusterdConfig config;
  // Set for --help or --version: print it to stdout and exit 0 (config is
  // the defaults then).
  std::optional<std::string> print;
};

// musterd's flags (`args` without the program's name). Errors are usage
// errors (exit 2), their message naming the flag and the fix.
absl::StatusOr<ParsedMusterdFlags> ParseMusterdFlags(const std::vector<std::string>& args);

// "90s", "30m", "1h", "1h30m", or plain seconds ("3600"); more than zero,
// or zero too when `zero_allowed`. `flag` names it in the error.
absl::StatusOr<absl::Duration> ParseDurationFlag(const std::string& flag, const std::string& text,
                                                 bool zero_allowed = false);

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_SERVER_MUSTERD_FLAGS_H_
