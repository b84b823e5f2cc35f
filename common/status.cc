#include "common/status.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace muster {

absl::Status ErrnoToStatus(int error_number, absl::string_view what) {
  std::string message = absl::StrCat(what, ": ", std::strerror(error_number));
  switch (error_number) {
    case ENOENT: return absl::NotFoundError(message);
    case EACCES:
    case EPERM: return absl::PermissionDeniedError(message);
    case EEXIST:
    case EADDRINUSE: return absl::AlreadyExistsError(message);
    case EINVAL:
    case ENOEXEC: return absl::InvalidArgumentError(message);
    case EMFILE:
    case ENFILE:
    case ENOMEM: return absl::ResourceExhaustedError(message);
    case EAGAIN:
    case EINTR:
    case ECONNREFUSED: return absl::UnavailableError(message);
    case ETIMEDOUT: return absl::DeadlineExceededError(message);
    default: return absl::InternalError(message);
  }
}

}  // namespace muster
