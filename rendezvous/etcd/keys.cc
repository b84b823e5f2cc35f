#include "rendezvous/etcd/keys.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace muster::etcd {
namespace {

bool Plain(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '~' || c == '-';
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;  // lower case is not what EscapeKeySegment writes
}

}  // namespace

std::string EscapeKeySegment(absl::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (Plain(u)) {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 0xF]);
    }
  }
  return out;
}

std::optional<std::string> UnescapeKeySegment(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto u = static_cast<unsigned char>(text[i]);
    if (Plain(u)) {
      out.push_back(text[i]);
      continue;
    }
    if (text[i] != '%' || i + 2 >= text.size()) return std::nullopt;
    const int high = HexValue(text[i + 1]);
    const int low = HexValue(text[i + 2]);
    if (high < 0 || low < 0) return std::nullopt;
    const auto decoded = static_cast<unsigned char>(high * 16 + low);
    if (Plain(decoded)) return std::nullopt;  // EscapeKeySegment leaves those as they are
    out.push_back(static_cast<char>(decoded));
    i += 2;
  }
  return out;
}

JobKeys::JobKeys(absl::string_view job_id)
    : prefix_(absl::StrCat(kKeyRoot, EscapeKeySegment(job_id), "/")) {}

std::optional<std::string> JobKeys::NodeOf(absl::string_view key, absl::string_view dir) {
  if (!absl::ConsumePrefix(&key, dir) || key.empty()) return std::nullopt;
  return UnescapeKeySegment(key);
}

}  // namespace muster::etcd
