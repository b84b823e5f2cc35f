// Where a rendezvous's TLS material is: paths of PEM files, named as
// torchrun's rendezvous configuration names them. Reading and checking them
// is tls.h's; this header carries no gRPC, so options structs can hold it.
#ifndef MUSTER_RENDEZVOUS_AUTH_TLS_FILES_H_
#define MUSTER_RENDEZVOUS_AUTH_TLS_FILES_H_

#include <string>

namespace muster::rdzv {

// Paths of PEM files; empty: not given.
struct TlsFiles {
  std::string cacert;  // the authority that signed the peer's certificate
  std::string cert;    // our own certificate (chain)
  std::string key;     // its private key, mode 600
  bool empty() const { return cacert.empty() && cert.empty() && key.empty(); }
};

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_AUTH_TLS_FILES_H_
