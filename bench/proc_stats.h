// What the scale bench reads of a process and of the machine: CPU time, peak
// memory, TCP segments and load, from /proc and getrusage. Each call reads
// afresh; Linux only.
#ifndef MUSTER_BENCH_PROC_STATS_H_
#define MUSTER_BENCH_PROC_STATS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace muster::rdzv::scale {

// utime + stime of `pid` (/proc/<pid>/stat), in seconds.
absl::StatusOr<double> ProcessCpuSeconds(pid_t pid);

// A "VmHWM:" style field of /proc/<pid>/status (kB there), in MiB.
absl::StatusOr<double> ProcessStatusMiB(pid_t pid, const std::string& key);

// User + system CPU of this process so far, in seconds.
double SelfCpuSeconds();

// TCP segments this host has sent (/proc/net/snmp, Tcp: OutSegs). On
// loopback that is both ends of every connection.
absl::StatusOr<int64_t> TcpOutSegments();

// Busy CPU seconds of the whole machine, every process and the kernel
// (/proc/stat: all but idle and iowait).
absl::StatusOr<double> MachineBusySeconds();

// The 1, 5 and 15 minute load averages (/proc/loadavg), space separated.
std::string LoadAverage();

}  // namespace muster::rdzv::scale

#endif  // MUSTER_BENCH_PROC_STATS_H_
