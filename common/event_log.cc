#include "common/event_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace muster {

absl::StatusOr<OpenedEventLog> OpenEventLog(const std::string& path, absl::string_view flag) {
  OpenedEventLog out;
  out.fd = UniqueFd(open(
      path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600));
  if (!out.fd.valid()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, ": cannot open (",
                                                   std::strerror(errno),
                                                   "); give a file in a directory you can write"));
  }
  struct stat st;
  if (fstat(out.fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, "=", path,
        ": not a regular file of yours; give a path of your own (the events name jobs)"));
  }
  if ((st.st_mode & 077) != 0) {
    out.warning = absl::StrFormat("%s=%s can be read by others (mode %03o)", flag, path,
                                  static_cast<unsigned>(st.st_mode & 0777));
  }
  return out;
}

}  // namespace muster
