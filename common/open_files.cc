#include "common/open_files.h"

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

std::optional<rlimit>& Original() {
  static std::optional<rlimit> original;
  return original;
}

}  // namespace

std::optional<std::string> RaiseOpenFileLimit(rlim_t wanted, const char* who) {
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return std::nullopt;
  if (limit.rlim_cur < limit.rlim_max) {
    const rlimit before = limit;
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) == 0) {
      if (!Original()) Original() = before;
    } else {
      limit = before;
    }
  }
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= wanted) return std::nullopt;
  return absl::StrCat("open-file limit is ", static_cast<uint64_t>(limit.rlim_cur),
                      ": at most about that many ", who,
                      "; raise it with ulimit -n (or LimitNOFILE= under systemd)");
}

std::optional<rlimit> OriginalOpenFileLimit() { return Original(); }

}  // namespace muster
