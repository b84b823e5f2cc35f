// One spdlog logger per component, all writing to stderr as "[muster:<component>] <level>: text".
#ifndef MUSTER_COMMON_LOG_H_
#define MUSTER_COMMON_LOG_H_

#include <memory>

#include "absl/strings/string_view.h"
#include "spdlog/spdlog.h"

// Debian's Abseil has its own string_view (not std::string_view): teach fmt to print it.
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  template <typename Context>
  auto format(absl::string_view text, Context& context) const {
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(text.data(), text.size()),
                                                    context);
  }
};

namespace muster {

// Returns the logger of `component` ("agent", "rdzv", ...), creating it on first use.
// Thread-safe.
std::shared_ptr<spdlog::logger> Logger(const char* component);

// Sets the level of every muster logger, current and future.
void SetLogLevel(spdlog::level::level_enum level);

}  // namespace muster

#endif  // MUSTER_COMMON_LOG_H_
