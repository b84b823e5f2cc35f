#include "allreduce/sweep.h"

#include <cctype>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace muster::allreduce {

absl::StatusOr<DataType> ParseDataType(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "float" || lower == "f32" || lower == "float32") return DataType::kFloat;
  if (lower == "half" || lower == "f16" || lower == "float16") return DataType::kHalf;
  if (lower == "bfloat16" || lower == "bf16") return DataType::kBfloat16;
  if (lower == "double" || lower == "f64" || lower == "float64") return DataType::kDouble;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown data type '", name, "'; use float, half, bfloat16 or double"));
}

const char* DataTypeName(DataType type) {
  switch (type) {
    case DataType::kFloat: return "float";
    case DataType::kHalf: return "half";
    case DataType::kBfloat16: return "bfloat16";
    case DataType::kDouble: return "double";
  }
  return "?";
}

int DataTypeSize(DataType type) {
  switch (type) {
    case DataType::kFloat: return 4;
    case DataType::kHalf: return 2;
    case DataType::kBfloat16: return 2;
    case DataType::kDouble: return 8;
  }
  return 1;
}

absl::StatusOr<int64_t> ParseBytes(absl::string_view text) {
  absl::string_view digits = text;
  int shift = 0;
  if (!digits.empty()) {
    switch (std::toupper(static_cast<unsigned char>(digits.back()))) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      default: break;
    }
    if (shift != 0) digits.remove_suffix(1);
  }
  int64_t value = 0;
  const bool all_digits =
      !digits.empty() && digits.find_first_not_of("0123456789") == absl::string_view::npos;
  if (!all_digits || !absl::SimpleAtoi(digits, &value) ||
      value > (std::numeric_limits<int64_t>::max() >> shift)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", text,
        "' is not a byte count; write digits with an optional K, M or G, e.g. 8, 64K, 1G"));
  }
  return value << shift;
}

absl::StatusOr<std::vector<SweepSize>> SizeSweep(int64_t min_bytes, int64_t max_bytes, int factor,
                                                 DataType type) {
  if (min_bytes < 1 || min_bytes > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the sweep needs 1 <= -b (", min_bytes, ") <= -e (", max_bytes, ")"));
  }
  if (factor < 2) {
    return absl::InvalidArgumentError(absl::StrCat("-f must be at least 2, not ", factor));
  }
  const int size = DataTypeSize(type);
  std::vector<SweepSize> sizes;
  for (int64_t bytes = min_bytes; bytes <= max_bytes;) {
    const int64_t count = bytes / size;
    if (count > 0) sizes.push_back({count * size, count});
    if (bytes > max_bytes / factor) break;  // the next would pass max (or overflow)
    bytes *= factor;
  }
  if (sizes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no size from ", min_bytes, " to ", max_bytes,
                                                   " bytes holds one ", DataTypeName(type), " (",
                                                   size, " bytes); raise -e"));
  }
  return sizes;
}

double AlgBandwidth(int64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
}

double AllReduceBusBandwidth(double algbw, int ranks) {
  return ranks > 0 ? algbw * 2.0 * (ranks - 1) / ranks : 0.0;
}

}  // namespace muster::allreduce
