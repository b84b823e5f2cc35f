// CRC-32C (Castagnoli), the checksum of the rendezvous journal's records:
// what leveldb's log and iSCSI use. Software, table-driven; a record of a
// few KiB costs microseconds, far below the fsync it precedes.
#ifndef MUSTER_COMMON_CRC32C_H_
#define MUSTER_COMMON_CRC32C_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace muster {

// The CRC-32C of `data`, continuing from `crc` (the CRC of what came before;
// 0 to start). Crc32c("123456789") == 0xE3069283.
uint32_t Crc32c(absl::string_view data, uint32_t crc = 0);

}  // namespace muster

#endif  // MUSTER_COMMON_CRC32C_H_
