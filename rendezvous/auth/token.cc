#include "rendezvous/auth/token.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "common/unique_handle.h"

namespace muster::rdzv {
namespace {

constexpr absl::string_view kHowToMake = "make one with: (umask 077; openssl rand -hex 32 > PATH)";

std::string HowToMake(const std::string& path) {
  std::string how(kHowToMake);
  how.replace(how.find("PATH"), 4, path);
  return how;
}

}  // namespace

absl::Status CheckTokenFileStat(const std::string& path, const struct stat& st, uid_t euid) {
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("token file ", path,
                     " is not a regular file; give the path of a file that holds the "
                     "token, ",
                     HowToMake(path)));
  }
  if (st.st_uid != euid) {
    return absl::FailedPreconditionError(absl::StrCat(
        "token file ", path, " is owned by uid ", st.st_uid, ", not by this user (uid ", euid,
        "): anyone who owns it can change the token; copy it to a file of "
        "your own with mode 600"));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "token file %s has mode %04o: group or others can read or change the token; run "
        "chmod 600 %s",
        path, st.st_mode & 07777, path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ParseToken(const std::string& path, absl::string_view contents) {
  if (contents.size() > kMaxTokenFileBytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("token file ", path, " is over ", kMaxTokenFileBytes,
                     " bytes: a token is one line; ", HowToMake(path)));
  }
  absl::string_view token = contents;
  if (absl::EndsWith(token, "\n")) token.remove_suffix(1);
  if (absl::EndsWith(token, "\r")) token.remove_suffix(1);
  if (token.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("token file ", path, " is empty; ", HowToMake(path)));
  }
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c == '\n') {
      return absl::FailedPreconditionError(
          absl::StrCat("token file ", path,
                       " has more than one line; the token is one line: ", HowToMake(path)));
    }
    if (c <= 0x20 || c >= 0x7f) {
      return absl::FailedPreconditionError(absl::StrCat(
          "token file ", path, " has a space or a non-printable character at byte ", i + 1,
          "; the token is one line of printable characters with no spaces: ", HowToMake(path)));
    }
  }
  if (token.size() < kMinTokenBytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("the token in ", path, " is ", token.size(), " bytes, under the ",
                     kMinTokenBytes, " needed to be hard to guess; ", HowToMake(path)));
  }
  return std::string(token);
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  if (path.empty()) {
    return absl::InvalidArgumentError("the token file's path is empty; give a path");
  }
  // O_NONBLOCK: a FIFO given by mistake is refused below, not waited on.
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  if (!fd.valid()) {
    const int error = errno;
    if (error == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("token file ", path, " does not exist; ", HowToMake(path)));
    }
    return ErrnoToStatus(error, absl::StrCat("cannot open token file ", path));
  }
  struct stat st = {};
  if (fstat(fd.get(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("fstat ", path));
  if (absl::Status checked = CheckTokenFileStat(path, st, geteuid()); !checked.ok()) {
    return checked;
  }
  std::string contents;
  char buffer[1024];
  while (contents.size() <= kMaxTokenFileBytes) {
    const ssize_t n = read(fd.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, absl::StrCat("read token file ", path));
    if (n == 0) break;
    contents.append(buffer, static_cast<size_t>(n));
  }
  return ParseToken(path, contents);
}

bool BearerMatches(absl::string_view value, absl::string_view token) {
  if (token.empty()) return false;
  const size_t prefix = kBearerPrefix.size();
  const size_t expected = prefix + token.size();
  // Every byte of the expected value is compared, whatever came: only the
  // token's length (not secret) decides how long this takes.
  unsigned char differ = value.size() == expected ? 0 : 1;
  for (size_t i = 0; i < expected; ++i) {
    const unsigned char want =
        static_cast<unsigned char>(i < prefix ? kBearerPrefix[i] : token[i - prefix]);
    const unsigned char got = static_cast<unsigned char>(i < value.size() ? value[i] : 0);
    differ |= want ^ got;
  }
  // Read through a volatile so the loop is not cut short by the optimizer.
  volatile unsigned char result = differ;
  return result == 0;
}

}  // namespace muster::rdzv
