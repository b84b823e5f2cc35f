#include "agent/error_file.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status.h"
#include "common/unique_handle.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace muster {
namespace {

using FieldMap = google::protobuf::Map<std::string, google::protobuf::Value>;

// A worker's traceback fits in far less; this only bounds what a broken worker can make us read.
constexpr size_t kMaxErrorFileBytes = 16 << 20;

const google::protobuf::Value* Find(const FieldMap& fields, const char* key) {
  auto it = fields.find(key);
  return it == fields.end() ? nullptr : &it->second;
}

std::string StringField(const FieldMap& fields, const char* key) {
  const google::protobuf::Value* value = Find(fields, key);
  if (value == nullptr || value->kind_case() != google::protobuf::Value::kStringValue) return "";
  return value->string_value();
}

std::optional<absl::Time> TimestampField(const FieldMap& fields, const char* key) {
  const google::protobuf::Value* value = Find(fields, key);
  if (value == nullptr) return std::nullopt;
  double seconds = 0;
  switch (value->kind_case()) {
    case google::protobuf::Value::kNumberValue: seconds = value->number_value(); break;
    case google::protobuf::Value::kStringValue:
      if (!absl::SimpleAtod(value->string_value(), &seconds)) return std::nullopt;
      break;
    default: return std::nullopt;
  }
  // Python's torchrun treats a missing timestamp as 0, which would always win the root cause.
  if (!std::isfinite(seconds) || seconds <= 0) return std::nullopt;
  return absl::UnixEpoch() + absl::Seconds(seconds);
}

}  // namespace

absl::StatusOr<WorkerError> ParseErrorJson(std::string_view json) {
  google::protobuf::Struct root;
  auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &root);
  if (!parsed.ok()) {
    auto why = parsed.message();
    return absl::InvalidArgumentError(absl::StrCat("error file is not a JSON object: ",
                                                   absl::string_view(why.data(), why.size())));
  }
  WorkerError error;
  const FieldMap& fields = root.fields();
  if (const google::protobuf::Value* message = Find(fields, "message"); message != nullptr) {
    if (message->kind_case() == google::protobuf::Value::kStringValue) {
      error.message = message->string_value();
    } else if (message->kind_case() == google::protobuf::Value::kStructValue) {
      const FieldMap& inner = message->struct_value().fields();
      error.message = StringField(inner, "message");
      const google::protobuf::Value* extra = Find(inner, "extraInfo");
      if (extra != nullptr && extra->kind_case() == google::protobuf::Value::kStructValue) {
        error.traceback = StringField(extra->struct_value().fields(), "py_callstack");
        error.timestamp = TimestampField(extra->struct_value().fields(), "timestamp");
      }
    }
  }
  if (!error.timestamp.has_value()) error.timestamp = TimestampField(fields, "timestamp");
  return error;
}

absl::StatusOr<WorkerError> ReadErrorFile(const std::string& path) {
  int raw_fd;
  do {
    raw_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (raw_fd < 0 && errno == EINTR);
  if (raw_fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  UniqueFd fd(raw_fd);

  std::string contents;
  char buffer[16 * 1024];
  for (;;) {
    ssize_t n = ::read(fd.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, absl::StrCat("read ", path));
    if (n == 0) break;
    if (contents.size() + static_cast<size_t>(n) > kMaxErrorFileBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": error file larger than ", kMaxErrorFileBytes, " bytes"));
    }
    contents.append(buffer, static_cast<size_t>(n));
  }
  absl::StatusOr<WorkerError> error = ParseErrorJson(contents);
  if (!error.ok()) {
    return absl::Status(error.status().code(), absl::StrCat(path, ": ", error.status().message()));
  }
  return error;
}

}  // namespace muster
