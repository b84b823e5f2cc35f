// The shared token that keeps a rendezvous to its job: one line of secret
// in a file that only its owner can read, given to every agent
// (--rdzv-conf token_file=PATH or MUSTER_TOKEN_FILE) and to musterd
// (--token-file PATH). Every call carries it as `authorization: Bearer
// <token>` metadata; a server with a token answers no call without it.
#ifndef MUSTER_RENDEZVOUS_AUTH_TOKEN_H_
#define MUSTER_RENDEZVOUS_AUTH_TOKEN_H_

#include <sys/stat.h>
#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muster::rdzv {

// The metadata key every call carries the token in (lower case, as gRPC
// wants), and the scheme before the token.
inline constexpr absl::string_view kAuthorizationKey = "authorization";
inline constexpr absl::string_view kBearerPrefix = "Bearer ";

// A token shorter than this is refused: it could be guessed.
inline constexpr size_t kMinTokenBytes = 16;
// A token file longer than this is not a token (a key or a log, given by mistake).
inline constexpr size_t kMaxTokenFileBytes = 4096;

// Reads the token from `path`: the file must be a regular file owned by
// this process's effective user, with no permission for group or others
// (mode & 077 == 0), holding one line of at least kMinTokenBytes printable
// ASCII characters with no spaces; one trailing newline ("\n" or "\r\n")
// is stripped. Errors are kFailedPrecondition (or kNotFound for a missing
// file), with a message that names the file, says what is wrong and how to
// fix it (for a mode: its mode and `chmod 600 PATH`). Follows symlinks:
// what is checked is the file read.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// The checks ReadTokenFile makes, on what it found: the file's `st`
// against the effective uid `euid`, and its `contents`. Pure.
absl::Status CheckTokenFileStat(const std::string& path, const struct stat& st, uid_t euid);
absl::StatusOr<std::string> ParseToken(const std::string& path, absl::string_view contents);

// Whether an `authorization` metadata value is "Bearer <token>". Takes the
// same time whatever `value` holds (for a given token length), so a caller
// cannot find the token a byte at a time. An empty `token` matches nothing.
bool BearerMatches(absl::string_view value, absl::string_view token);

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_AUTH_TOKEN_H_
