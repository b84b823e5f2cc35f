#include "allreduce/report.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace muster::allreduce {
namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string Number(double value) { return absl::StrFormat("%.6g", value); }

}  // namespace

std::string TableHeader() {
  return absl::StrFormat(
      "#%11s %12s %9s %6s  %10s %7s %7s %6s  %10s %7s %7s %6s\n"
      "#%11s %12s %9s %6s  %10s %7s %7s %6s  %10s %7s %7s %6s\n",
      "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong", "time", "algbw",
      "busbw", "#wrong", "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)",
      "(GB/s)", "(GB/s)", "");
}

std::string TableRow(const SizeResult& r, int ranks) {
  const double algbw = AlgBandwidth(r.bytes, r.time_us / 1e6);
  const double inplace_algbw = AlgBandwidth(r.bytes, r.inplace_time_us / 1e6);
  return absl::StrFormat("%12d %12d %9s %6s  %10.2f %7.2f %7.2f %6d  %10.2f %7.2f %7.2f %6d\n",
                         r.bytes, r.count, DataTypeName(r.type), "sum", r.time_us, algbw,
                         AllReduceBusBandwidth(algbw, ranks), r.wrong, r.inplace_time_us,
                         inplace_algbw, AllReduceBusBandwidth(inplace_algbw, ranks),
                         r.inplace_wrong);
}

double AverageBusBandwidth(const std::vector<SizeResult>& results, int ranks) {
  if (results.empty()) return 0;
  double sum = 0;
  for (const SizeResult& r : results) {
    sum += AllReduceBusBandwidth(AlgBandwidth(r.bytes, r.time_us / 1e6), ranks);
    sum += AllReduceBusBandwidth(AlgBandwidth(r.bytes, r.inplace_time_us / 1e6), ranks);
  }
  return sum / (2.0 * results.size());
}

std::string JsonReport(const RunSummary& s) {
  std::vector<std::string> hosts, devices, rows;
  for (const std::string& h : s.hosts) hosts.push_back(JsonString(h));
  for (const std::string& d : s.devices) devices.push_back(JsonString(d));
  for (const SizeResult& r : s.results) {
    const double algbw = AlgBandwidth(r.bytes, r.time_us / 1e6);
    const double inplace_algbw = AlgBandwidth(r.bytes, r.inplace_time_us / 1e6);
    rows.push_back(absl::StrCat(
        "    {\"bytes\": ", r.bytes, ", \"count\": ", r.count, ", \"dtype\": \"",
        DataTypeName(r.type), "\", \"time_us\": ", Number(r.time_us), ", \"algbw_gbps\": ",
        Number(algbw), ", \"busbw_gbps\": ", Number(AllReduceBusBandwidth(algbw, s.world_size)),
        ", \"wrong\": ", r.wrong, ", \"inplace\": {\"time_us\": ", Number(r.inplace_time_us),
        ", \"algbw_gbps\": ", Number(inplace_algbw),
        ", \"busbw_gbps\": ", Number(AllReduceBusBandwidth(inplace_algbw, s.world_size)),
        ", \"wrong\": ", r.inplace_wrong, "}}"));
  }
  return absl::StrCat(
      "{\n  \"backend\": ", JsonString(s.backend), ",\n  \"world_size\": ", s.world_size,
      ",\n  \"hosts\": [", absl::StrJoin(hosts, ", "), "]", ",\n  \"devices\": [",
      absl::StrJoin(devices, ", "), "]",
      ",\n  \"avg_busbw_gbps\": ", Number(AverageBusBandwidth(s.results, s.world_size)),
      ",\n  \"results\": [\n", absl::StrJoin(rows, ",\n"), "\n  ]\n}\n");
}

}  // namespace muster::allreduce
