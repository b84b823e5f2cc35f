#include "agent/progress.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/unique_handle.h"

namespace muster {
namespace {

constexpr int64_t kMaxValue = int64_t{1} << 53;  // rdzv::kMaxProgressValue

std::optional<int64_t> ParseValue(absl::string_view text) {
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text.front()))) return std::nullopt;
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value > kMaxValue) return std::nullopt;
  return value;
}

}  // namespace

std::optional<StepLine> ParseProgress(absl::string_view text) {
  const size_t newline = text.find('\n');
  if (newline == absl::string_view::npos && text.size() >= kMaxProgressLine) return std::nullopt;
  const absl::string_view line = absl::StripAsciiWhitespace(text.substr(0, newline));
  std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipWhitespace());
  if (fields.empty() || fields.size() > 2) return std::nullopt;
  std::optional<int64_t> step = ParseValue(fields[0]);
  if (!step) return std::nullopt;
  StepLine parsed;
  parsed.step = *step;
  if (fields.size() == 2) {
    std::optional<int64_t> count = ParseValue(fields[1]);
    if (!count) return std::nullopt;
    parsed.count = *count;
  }
  return parsed;
}

std::optional<NodeProgress> ReadProgressFile(const std::string& path) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!fd.valid()) return std::nullopt;
  struct stat st;
  if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  char buffer[kMaxProgressLine];
  const ssize_t got = pread(fd.get(), buffer, sizeof(buffer), 0);
  if (got <= 0) return std::nullopt;
  std::optional<StepLine> line = ParseProgress(absl::string_view(buffer, static_cast<size_t>(got)));
  if (!line) return std::nullopt;
  NodeProgress progress;
  progress.step = line->step;
  progress.count = line->count;
  progress.written = absl::TimeFromTimespec(st.st_mtim);
  return progress;
}

}  // namespace muster
