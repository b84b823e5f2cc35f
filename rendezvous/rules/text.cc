#include "rendezvous/rules/text.h"

#include "absl/strings/str_cat.h"

namespace muster::rdzv {

std::string CutText(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  // Room for the mark with any count of bytes cut (20 digits at most).
  constexpr size_t kMarkRoom = sizeof("... [cut:  bytes]") - 1 + 20;
  size_t keep = max_bytes > kMarkRoom ? max_bytes - kMarkRoom : 0;
  while (keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xC0) == 0x80) --keep;
  return absl::StrCat(text.substr(0, keep), "... [cut: ", text.size() - keep, " bytes]");
}

}  // namespace muster::rdzv
