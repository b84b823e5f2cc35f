#include "rendezvous/auth/munge.h"

#include <munge.h>
#include <sys/stat.h>

#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"

namespace muster::rdzv {
namespace {

struct ContextDeleter {
  void operator()(munge_ctx_t context) const { munge_ctx_destroy(context); }
};
using UniqueContext = std::unique_ptr<std::remove_pointer_t<munge_ctx_t>, ContextDeleter>;

absl::StatusOr<UniqueContext> NewContext(const MungeOptions& options) {
  UniqueContext context(munge_ctx_create());
  if (context == nullptr) return absl::ResourceExhaustedError("munge: cannot allocate a context");
  if (!options.socket.empty() &&
      munge_ctx_set(context.get(), MUNGE_OPT_SOCKET, options.socket.c_str()) != EMUNGE_SUCCESS) {
    return absl::InvalidArgumentError(absl::StrCat("munge: bad socket ", options.socket, ": ",
                                                   munge_ctx_strerror(context.get())));
  }
  return context;
}

std::string SocketOf(const MungeOptions& options) {
  return options.socket.empty() ? DefaultMungeSocket() : options.socket;
}

absl::Status ToStatus(munge_err_t error, munge_ctx_t context, const MungeOptions& options,
                      bool decoding) {
  const char* what = decoding ? "decode" : "encode";
  const char* detail = munge_ctx_strerror(context);
  const std::string message =
      absl::StrCat("munge ", what, ": ", detail != nullptr ? detail : munge_strerror(error));
  switch (error) {
    case EMUNGE_SOCKET:
      return absl::UnavailableError(
          absl::StrCat(message, " (is munged running? its socket is ", SocketOf(options), ")"));
    case EMUNGE_SNAFU:
    case EMUNGE_NO_MEMORY:
    case EMUNGE_OVERFLOW: return absl::InternalError(message);
    // Anything else a decode says is of the credential: forged, empty,
    // expired, replayed, of another key.
    default: return decoding ? absl::UnauthenticatedError(message) : absl::InternalError(message);
  }
}

}  // namespace

std::string DefaultMungeSocket() {
  UniqueContext context(munge_ctx_create());
  char* socket = nullptr;
  if (context != nullptr &&
      munge_ctx_get(context.get(), MUNGE_OPT_SOCKET, &socket) == EMUNGE_SUCCESS &&
      socket != nullptr) {
    return socket;  // owned by the context: copied before it goes
  }
  return "/run/munge/munge.socket.2";
}

bool MungeSocketPresent(const MungeOptions& options) {
  struct stat st;
  return ::stat(SocketOf(options).c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

absl::StatusOr<std::string> EncodeMungeCredential(const MungeOptions& options) {
  absl::StatusOr<UniqueContext> context = NewContext(options);
  if (!context.ok()) return context.status();
  char* raw = nullptr;
  const munge_err_t error = munge_encode(&raw, context->get(), nullptr, 0);
  std::unique_ptr<char, decltype(&std::free)> credential(raw, &std::free);
  if (error != EMUNGE_SUCCESS) return ToStatus(error, context->get(), options, false);
  return std::string(credential.get());
}

absl::StatusOr<MungeIdentity> DecodeMungeCredential(const std::string& credential,
                                                    const MungeOptions& options) {
  absl::StatusOr<UniqueContext> context = NewContext(options);
  if (!context.ok()) return context.status();
  void* payload = nullptr;
  int length = 0;
  MungeIdentity identity;
  const munge_err_t error = munge_decode(credential.c_str(), context->get(), &payload, &length,
                                         &identity.uid, &identity.gid);
  std::free(payload);  // none is sent; a forged credential may carry one
  if (error != EMUNGE_SUCCESS) return ToStatus(error, context->get(), options, true);
  return identity;
}

}  // namespace muster::rdzv
