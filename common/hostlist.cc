#include "common/hostlist.h"

#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace muster {
namespace {

absl::Status Bad(absl::string_view list, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "bad host list '", list, "': ", why, " (expected names like gpu01,gpu02 or gpu[01-04,07])"));
}

bool AllDigits(absl::string_view s) {
  return !s.empty() && s.find_first_not_of("0123456789") == absl::string_view::npos;
}

// "01-04,07" -> {"01", "02", "03", "04", "07"}.
absl::StatusOr<std::vector<std::string>> ExpandGroup(absl::string_view group,
                                                     absl::string_view list, size_t limit) {
  std::vector<std::string> out;
  if (group.empty()) return Bad(list, "an empty [] group");
  for (absl::string_view part : absl::StrSplit(group, ',')) {
    const size_t dash = part.find('-');
    const absl::string_view lo = part.substr(0, dash);
    const absl::string_view hi = dash == absl::string_view::npos ? lo : part.substr(dash + 1);
    uint64_t first = 0, last = 0;
    if (!AllDigits(lo) || !AllDigits(hi) || lo.size() > 18 || hi.size() > 18 ||
        !absl::SimpleAtoi(lo, &first) || !absl::SimpleAtoi(hi, &last)) {
      return Bad(list,
                 absl::StrCat("'", part, "' in [", group, "] is not a number or a range lo-hi"));
    }
    if (last < first) {
      return Bad(list, absl::StrCat("the range ", part, " runs backwards"));
    }
    if (last - first >= limit || out.size() + (last - first + 1) > limit) {
      return Bad(list, absl::StrCat("more than ", limit, " hosts"));
    }
    const int width = static_cast<int>(lo.size());
    for (uint64_t n = first; n <= last; ++n) out.push_back(absl::StrFormat("%0*d", width, n));
  }
  return out;
}

// One item, "rack[1-2]-n[01-02]": the product of its groups.
absl::Status ExpandItem(absl::string_view item, absl::string_view list, size_t limit,
                        std::vector<std::string>* hosts) {
  std::vector<std::string> partial = {""};
  size_t pos = 0;
  while (pos < item.size()) {
    const size_t open = item.find('[', pos);
    const size_t close_early = item.find(']', pos);
    if (close_early != absl::string_view::npos &&
        (open == absl::string_view::npos || close_early < open)) {
      return Bad(list, "a ']' with no '['");
    }
    const absl::string_view text =
        item.substr(pos, open == absl::string_view::npos ? open : open - pos);
    for (std::string& p : partial) absl::StrAppend(&p, text);
    if (open == absl::string_view::npos) break;
    const size_t close = item.find(']', open);
    if (close == absl::string_view::npos)
      return Bad(list, absl::StrCat("'[' with no ']' in ", item));
    const absl::string_view group = item.substr(open + 1, close - open - 1);
    if (group.find('[') != absl::string_view::npos) return Bad(list, "nested brackets");
    absl::StatusOr<std::vector<std::string>> numbers = ExpandGroup(group, list, limit);
    if (!numbers.ok()) return numbers.status();
    if (partial.size() * numbers->size() > limit) {
      return Bad(list, absl::StrCat("more than ", limit, " hosts"));
    }
    std::vector<std::string> next;
    next.reserve(partial.size() * numbers->size());
    for (const std::string& p : partial) {
      for (const std::string& n : *numbers) next.push_back(p + n);
    }
    partial = std::move(next);
    pos = close + 1;
  }
  if (hosts->size() + partial.size() > limit)
    return Bad(list, absl::StrCat("more than ", limit, " hosts"));
  for (std::string& p : partial) hosts->push_back(std::move(p));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandHostlist(absl::string_view list, size_t limit) {
  std::vector<std::string> hosts;
  // Split at commas and white space outside brackets.
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) return Bad(list, "a ']' with no '['");
    const bool separator =
        depth == 0 && (c == ',' || absl::ascii_isspace(static_cast<unsigned char>(c)));
    if (!separator) continue;
    const absl::string_view item = list.substr(start, i - start);
    start = i + 1;
    if (item.empty()) continue;
    if (absl::Status expanded = ExpandItem(item, list, limit, &hosts); !expanded.ok())
      return expanded;
  }
  if (depth != 0) return Bad(list, "'[' with no ']'");
  if (hosts.empty()) return Bad(list, "no host in it");
  return hosts;
}

}  // namespace muster
