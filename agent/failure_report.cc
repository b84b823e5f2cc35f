#include "agent/failure_report.h"

#include <signal.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace muster {
namespace {

// Abseil is built here with its own string_view (ABSL_OPTION_USE_STD_STRING_VIEW 0), so the text
// handling below stays in absl::string_view.

constexpr absl::string_view kNoErrorFile =
    "no error file written (use torch.distributed.elastic.multiprocessing.errors.record)";
constexpr absl::string_view kPreflightReport =
    "the pre-flight all-reduce failed: muster-allreduce's report (above) says how";
constexpr absl::string_view kEmptyErrorFile = "error file has no message";
constexpr size_t kMinRuleWidth = 60;
// Of a hung worker's stacks, the report shows this many lines; the file has them all.
constexpr size_t kMaxStackLines = 80;
constexpr size_t kMaxRuleWidth = 100;

absl::Time HappenedAt(const WorkerFailure& failure) {
  if (failure.error.has_value() && failure.error->timestamp.has_value()) {
    return *failure.error->timestamp;
  }
  return failure.time;
}

// Failure indices, first failure first (the order RootCauseIndex documents).
std::vector<size_t> FailureOrder(const std::vector<WorkerFailure>& failures) {
  std::vector<size_t> order(failures.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int64_t a_seconds = absl::ToUnixSeconds(HappenedAt(failures[a]));
    const int64_t b_seconds = absl::ToUnixSeconds(HappenedAt(failures[b]));
    if (a_seconds != b_seconds) return a_seconds < b_seconds;
    return failures[a].time < failures[b].time;
  });
  return order;
}

absl::string_view TrimTrailing(absl::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) {
    text.remove_suffix(1);
  }
  return text;
}

absl::string_view FirstLine(absl::string_view text) {
  return TrimTrailing(text.substr(0, text.find('\n')));
}

// Python's traceback ends with the "<Type>: <text>" line, the best summary when there is no
// message.
absl::string_view LastLine(absl::string_view text) {
  text = TrimTrailing(text);
  const size_t newline = text.rfind('\n');
  return newline == absl::string_view::npos ? text : text.substr(newline + 1);
}

absl::string_view Summary(const WorkerFailure& failure) {
  if (!failure.error.has_value() && !failure.killed_for.empty()) return failure.killed_for;
  if (!failure.error.has_value()) return failure.preflight ? kPreflightReport : kNoErrorFile;
  absl::string_view line = FirstLine(failure.error->message);
  if (line.empty()) line = absl::StripLeadingAsciiWhitespace(LastLine(failure.error->traceback));
  return line.empty() ? kEmptyErrorFile : line;
}

std::string FormatTimeMs(absl::Time time) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", time, absl::UTCTimeZone());
}

// Appends text's lines, each but an empty one indented (the first only if indent_first), and a
// final '\n'.
void AppendIndented(std::string& out, absl::string_view indent, absl::string_view text,
                    bool indent_first = true) {
  bool first = true;
  for (absl::string_view line : absl::StrSplit(TrimTrailing(text), '\n')) {
    line = TrimTrailing(line);
    const bool indented = !line.empty() && (indent_first || !first);
    absl::StrAppend(&out, indented ? indent : "", line, "\n");
    first = false;
  }
}

}  // namespace

std::string SignalName(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
#ifdef SIGSTKFLT
    case SIGSTKFLT: return "SIGSTKFLT";
#endif
    case SIGCHLD: return "SIGCHLD";
    case SIGCONT: return "SIGCONT";
    case SIGSTOP: return "SIGSTOP";
    case SIGTSTP: return "SIGTSTP";
    case SIGTTIN: return "SIGTTIN";
    case SIGTTOU: return "SIGTTOU";
    case SIGURG: return "SIGURG";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGVTALRM: return "SIGVTALRM";
    case SIGPROF: return "SIGPROF";
    case SIGWINCH: return "SIGWINCH";
    case SIGIO: return "SIGIO";
#ifdef SIGPWR
    case SIGPWR: return "SIGPWR";
#endif
    case SIGSYS: return "SIGSYS";
    default: break;
  }
  if (sig == SIGRTMIN) return "SIGRTMIN";
  if (sig > SIGRTMIN && sig <= SIGRTMAX) return absl::StrCat("SIGRTMIN+", sig - SIGRTMIN);
  return absl::StrCat("signal ", sig);
}

std::string DescribeExit(const WorkerFailure& failure) {
  if (failure.signal != 0) {
    return absl::StrCat("Signal ", failure.signal, " (", SignalName(failure.signal), ")");
  }
  return absl::StrCat("exit code ", failure.exit_code);
}

size_t RootCauseIndex(const std::vector<WorkerFailure>& failures) {
  if (failures.empty()) return failures.size();
  return FailureOrder(failures).front();
}

std::string FormatFailureReport(std::string_view script, int attempts,
                                const std::vector<WorkerFailure>& failures) {
  const std::string title =
      absl::StrCat(absl::string_view(script.data(), script.size()), " FAILED after ", attempts,
                   attempts == 1 ? " attempt" : " attempts");
  const std::vector<size_t> order = FailureOrder(failures);

  // Rows of cells; row 0 is the header. The last column is never padded.
  constexpr size_t kColumns = 6;
  std::vector<std::array<std::string, kColumns>> rows;
  rows.reserve(order.size() + 1);
  rows.push_back({"rank (local)", "host", "pid", "exit", "time (UTC)", "message"});
  for (size_t index : order) {
    const WorkerFailure& failure = failures[index];
    rows.push_back({absl::StrCat(failure.rank, " (", failure.local_rank, ")"), failure.host,
                    absl::StrCat(failure.pid), DescribeExit(failure), FormatTimeMs(failure.time),
                    std::string(Summary(failure))});
  }
  std::array<size_t, kColumns> widths = {};
  for (const auto& row : rows) {
    for (size_t c = 0; c < kColumns; ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::vector<std::string> lines;
  lines.reserve(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    std::string line = r == 1 ? "  * " : "    ";
    for (size_t c = 0; c < kColumns; ++c) {
      line += rows[r][c];
      if (c + 1 < kColumns) line.append(widths[c] - rows[r][c].size() + 2, ' ');
    }
    lines.push_back(std::move(line));
  }

  size_t width = title.size();
  for (const std::string& line : lines) width = std::max(width, line.size());
  width = std::clamp(width, kMinRuleWidth, kMaxRuleWidth);
  const std::string border(width, '=');
  const std::string section(width, '-');

  std::string out;
  absl::StrAppend(&out, border, "\n", title, "\n", section, "\n");
  if (failures.empty()) {
    absl::StrAppend(&out, "Failures:\n  <no failures recorded>\n", border, "\n");
    return out;
  }
  absl::StrAppend(&out, "Failures (* = root cause, then in the order they failed):\n");
  for (const std::string& line : lines) absl::StrAppend(&out, line, "\n");

  const WorkerFailure& root = failures[order.front()];
  absl::StrAppend(&out, section, "\n", "Root Cause (first observed failure):\n", "  rank ",
                  root.rank, " (local_rank ", root.local_rank, ") on ", root.host, ", pid ",
                  root.pid, ": ", DescribeExit(root), ", seen at ", FormatTimeMs(root.time), "\n");
  if (!root.killed_for.empty()) {
    absl::StrAppend(&out, "  muster killed it: ", root.killed_for, "\n");
    if (!root.stack.empty()) {
      absl::StrAppend(&out, "  stacks    : ", root.stack_file, "\n");
      std::vector<absl::string_view> stack_lines = absl::StrSplit(TrimTrailing(root.stack), '\n');
      const size_t shown = std::min(stack_lines.size(), kMaxStackLines);
      AppendIndented(out, "    ",
                     absl::StrJoin(stack_lines.begin(), stack_lines.begin() + shown, "\n"));
      if (shown < stack_lines.size()) {
        absl::StrAppend(&out, "    ... ", stack_lines.size() - shown,
                        " more lines in the file above\n");
      }
    } else if (!root.stack_file.empty()) {
      absl::StrAppend(&out, "  stacks    : ", root.stack_file, "\n");
    }
  }
  if (!root.nccl_dump.empty()) {
    absl::StrAppend(&out, "  NCCL flight recorder dump: ", root.nccl_dump, "\n");
  }
  if (!root.error.has_value()) {
    if (root.killed_for.empty()) absl::StrAppend(&out, "  ", Summary(root), "\n");
  } else {
    const WorkerError& error = *root.error;
    absl::StrAppend(&out, "  error_file: ", root.error_file);
    if (error.timestamp.has_value()) {
      absl::StrAppend(
          &out, " (error at ",
          absl::FormatTime("%Y-%m-%dT%H:%M:%E*SZ", *error.timestamp, absl::UTCTimeZone()), ")");
    }
    absl::StrAppend(&out, "\n");
    if (!TrimTrailing(error.message).empty()) {
      absl::StrAppend(&out, "  message   : ");
      AppendIndented(out, "              ", error.message, /*indent_first=*/false);
    }
    if (!TrimTrailing(error.traceback).empty()) {
      absl::StrAppend(&out, "  traceback :\n");
      AppendIndented(out, "    ", error.traceback);
    }
    if (TrimTrailing(error.message).empty() && TrimTrailing(error.traceback).empty()) {
      absl::StrAppend(&out, "  ", kEmptyErrorFile, "\n");
    }
  }
  absl::StrAppend(&out, border, "\n");
  return out;
}

}  // namespace muster
