// musterctl's command line: the command, where its server is and how to
// reach it, the job's credential as its agents give it. Parsed and checked
// with no file read and no connection made (musterctl.cc does those).
#ifndef MUSTER_CTL_FLAGS_H_
#define MUSTER_CTL_FLAGS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rendezvous/auth/tls_files.h"

namespace muster::ctl {

inline constexpr int kExitYes = 0;
inline constexpr int kExitNo = 1;
inline constexpr int kExitUsage = 2;

enum class Command { kStatus, kWatch, kStop, kHealth };

// The job's credential, given as its agents give it (not for health).
struct Auth {
  std::string token_file;  // --token-file; empty: MUSTER_TOKEN_FILE, if set
  bool munge = false;
  std::string munge_socket;
};

struct Config {
  Command command = Command::kStatus;
  std::string endpoint;  // HOST:PORT as dialled (the default port filled in)
  rdzv::TlsFiles tls;    // cert and key need cacert
  absl::Duration timeout = absl::Seconds(5);
  Auth auth;
  std::string job;      // status (empty: every job), watch, stop
  bool json = false;    // status, watch
  std::string reason;   // stop
  std::string service;  // health (empty: the server's)
};

struct ParsedFlags {
  Config config;
  // Set for --help or --version: print it to stdout and exit 0.
  std::optional<std::string> print;
};

// musterctl's flags (`args` without the program's name). Errors are usage
// errors (exit 2), naming the flag and the fix.
absl::StatusOr<ParsedFlags> ParseFlags(const std::vector<std::string>& args);

}  // namespace muster::ctl

#endif  // MUSTER_CTL_FLAGS_H_
