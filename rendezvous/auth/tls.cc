#include "rendezvous/auth/tls.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "common/unique_handle.h"

namespace muster::rdzv {
namespace {

// A PEM file of at most 1 MiB; `what` names it in errors ("TLS key").
absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what, bool secret) {
  constexpr off_t kMaxPemBytes = 1 << 20;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, ": ", ErrnoToStatus(errno, "open").message()));
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > kMaxPemBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, ": not a PEM file (a regular file of at most 1 MiB)"));
  }
  if (secret && (st.st_mode & 077) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " ", path, " is open to others (mode ", absl::StrFormat("%04o", st.st_mode & 0777),
        "); it must be its owner's alone: chmod 600 ", path));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": short read"));
    done += static_cast<size_t>(n);
  }
  if (!absl::StrContains(text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, ": not PEM (no -----BEGIN line)"));
  }
  return text;
}

// The certificate and its key, both or neither.
absl::Status ReadPair(const TlsFiles& files, std::string* cert, std::string* key) {
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs cert and key together: give both (cert=PATH,key=PATH), or neither");
  }
  if (files.cert.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> c = ReadPem(files.cert, "TLS certificate", false);
  if (!c.ok()) return c.status();
  absl::StatusOr<std::string> k = ReadPem(files.key, "TLS key", true);
  if (!k.ok()) return k.status();
  *cert = *std::move(c);
  *key = *std::move(k);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerTlsCredentials(
    const TlsFiles& files) {
  if (files.cert.empty()) {
    return absl::InvalidArgumentError(
        "a TLS server needs its certificate and key: give cert=PATH and key=PATH "
        "(musterd --tls-cert and --tls-key)");
  }
  grpc::SslServerCredentialsOptions options;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  if (absl::Status read = ReadPair(files, &pair.cert_chain, &pair.private_key); !read.ok()) {
    return read;
  }
  options.pem_key_cert_pairs.push_back(std::move(pair));
  if (!files.cacert.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(files.cacert, "TLS CA certificate", false);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientTlsCredentials(
    const TlsFiles& files) {
  if (files.cacert.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs the authority that signed the server's certificate: give cacert=PATH");
  }
  grpc::SslCredentialsOptions options;
  absl::StatusOr<std::string> ca = ReadPem(files.cacert, "TLS CA certificate", false);
  if (!ca.ok()) return ca.status();
  options.pem_root_certs = *std::move(ca);
  if (absl::Status read = ReadPair(files, &options.pem_cert_chain, &options.pem_private_key);
      !read.ok()) {
    return read;
  }
  return grpc::SslCredentials(options);
}

}  // namespace muster::rdzv
