// TLS for the rendezvous: gRPC's SSL credentials built from PEM files, named
// as torchrun's rendezvous configuration names them (cacert, cert, key).
//
// The server presents `cert` and `key`; with `cacert` it also asks every
// client for a certificate signed by that authority (mutual TLS). The client
// checks the server's certificate against `cacert` and the host it dialled
// (a name or IP address in the certificate's subjectAltName), and presents
// `cert` and `key` when given.
#ifndef MUSTER_RENDEZVOUS_AUTH_TLS_H_
#define MUSTER_RENDEZVOUS_AUTH_TLS_H_

#include <memory>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"
#include "rendezvous/auth/tls_files.h"

namespace muster::rdzv {

// Errors (kInvalidArgument) name the file and the fix: a missing or
// unreadable file, a file that is not PEM, cert without key or key without
// cert, a key readable by group or others (chmod 600).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerTlsCredentials(
    const TlsFiles& files);
// REQUIRES: files.cacert, the authority the server's certificate is checked against.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientTlsCredentials(
    const TlsFiles& files);

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_AUTH_TLS_H_
