#include "common/json.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace muster {
namespace {

// The length of the valid UTF-8 sequence at the start of `text`, or 0 when
// none starts there (overlong forms, surrogates and values past U+10FFFF are
// invalid, as RFC 3629 says).
size_t Utf8Length(absl::string_view text) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t lead = byte(0);
  size_t length = 0;
  uint8_t low = 0x80, high = 0xBF;  // the second byte's range
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (text.size() < length || byte(1) < low || byte(1) > high) return 0;
  for (size_t i = 2; i < length; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xBF) return 0;
  }
  return length;
}

}  // namespace

std::string JsonQuote(absl::string_view text) {
  std::string out = "\"";
  out.reserve(text.size() + 2);
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    const auto u = static_cast<uint8_t>(c);
    if (u >= 0x80) {
      const size_t length = Utf8Length(text.substr(i));
      if (length == 0) {
        out += "\\ufffd";
        ++i;
      } else {
        out.append(text.data() + i, length);
        i += length;
      }
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (u < 0x20 || u == 0x7F) {
          out += absl::StrFormat("\\u%04x", u);
        } else {
          out.push_back(c);
        }
    }
    ++i;
  }
  out.push_back('"');
  return out;
}

std::string EventJsonLine(const EventLine& event) {
  return absl::StrCat(
      "{\"time\": ", absl::StrFormat("%.3f", absl::ToDoubleSeconds(event.time - absl::UnixEpoch())),
      ", \"job\": ", JsonQuote(event.job), ", \"round\": ", event.round,
      ", \"node\": ", JsonQuote(event.node), ", \"kind\": ", JsonQuote(event.kind),
      ", \"detail\": ", JsonQuote(event.detail), "}\n");
}

}  // namespace muster
