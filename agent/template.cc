#include "agent/template.h"

#include "absl/strings/ascii.h"

namespace muster {
namespace {

bool StartsName(char c) { return absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool InName(char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_'; }

}  // namespace

std::string SubstituteTemplate(absl::string_view text,
                               const std::map<std::string, std::string, std::less<>>& vars) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const size_t dollar = text.find('$', i);
    if (dollar == absl::string_view::npos) {
      out.append(text.data() + i, text.size() - i);
      break;
    }
    out.append(text.data() + i, dollar - i);
    i = dollar + 1;
    if (i < text.size() && text[i] == '$') {
      out.push_back('$');
      ++i;
      continue;
    }
    const bool braced = i < text.size() && text[i] == '{';
    const size_t start = braced ? i + 1 : i;
    size_t end = start;
    if (end < text.size() && StartsName(text[end])) {
      ++end;
      while (end < text.size() && InName(text[end])) ++end;
    }
    const absl::string_view name = text.substr(start, end - start);
    const bool closed = !braced || (end < text.size() && text[end] == '}');
    auto found = name.empty() || !closed ? vars.end() : vars.find(name);
    if (found == vars.end()) {
      out.push_back('$');  // left as it is; the scan goes on after the `$`
      continue;
    }
    out.append(found->second);
    i = braced ? end + 1 : end;
  }
  return out;
}

}  // namespace muster
