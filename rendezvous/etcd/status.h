// absl::Status in etcd values (proto/etcd_rendezvous.proto's EtcdStatus):
// how the leader's answers travel to a node through its outbox.
#ifndef MUSTER_RENDEZVOUS_ETCD_STATUS_H_
#define MUSTER_RENDEZVOUS_ETCD_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "proto/etcd_rendezvous.pb.h"

namespace muster::etcd {

inline rdzv::EtcdStatus ToEtcdStatus(const absl::Status& status) {
  rdzv::EtcdStatus out;
  out.set_code(static_cast<int>(status.code()));
  out.set_message(std::string(status.message()));
  return out;
}

// A code no absl::StatusCode has reads as kUnknown.
inline absl::Status FromEtcdStatus(const rdzv::EtcdStatus& status) {
  const int code = status.code();
  if (code == 0) return absl::OkStatus();
  if (code < 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::UnknownError(status.message());
  }
  return absl::Status(static_cast<absl::StatusCode>(code), status.message());
}

}  // namespace muster::etcd

#endif  // MUSTER_RENDEZVOUS_ETCD_STATUS_H_
