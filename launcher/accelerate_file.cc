#include "launcher/accelerate_file.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/free_port.h"
#include "common/process_env.h"
#include "common/unique_handle.h"

namespace muster {
namespace {

// Files this big are no accelerate config.
constexpr size_t kMaxBytes = 1 << 20;
// Nesting deeper than this is no accelerate config either (and bounds the recursion).
constexpr int kMaxDepth = 32;

class Parser {
 public:
  Parser(const std::string& text, std::string path, bool json)
      : path_(std::move(path)), json_(json) {
    yaml_parser_initialize(&parser_);
    yaml_parser_set_input_string(&parser_, reinterpret_cast<const unsigned char*>(text.data()),
                                 text.size());
  }
  ~Parser() { yaml_parser_delete(&parser_); }
  Parser(const Parser&) = delete;
  Parser& operator=(const Parser&) = delete;

  // The first document's value; an empty file is an empty mapping's absence (None).
  absl::StatusOr<ConfigValue> Document() {
    absl::Status status = Expect(YAML_STREAM_START_EVENT);
    if (!status.ok()) return status;
    absl::StatusOr<yaml_event_type_t> next = Next();
    if (!next.ok()) return next.status();
    if (*next == YAML_STREAM_END_EVENT) return ConfigValue::None();
    if (*next != YAML_DOCUMENT_START_EVENT) return Error("expected a document");
    absl::StatusOr<yaml_event_type_t> first = Next();
    if (!first.ok()) return first.status();
    absl::StatusOr<ConfigValue> value = Value(0);
    if (!value.ok()) return value.status();
    // As yaml.safe_load: one document, and nothing after it.
    if (absl::Status end = Expect(YAML_DOCUMENT_END_EVENT); !end.ok()) return end;
    absl::StatusOr<yaml_event_type_t> after = Next();
    if (!after.ok()) return after.status();
    if (*after != YAML_STREAM_END_EVENT) return Error("several YAML documents; give one");
    return value;
  }

 private:
  struct Event {
    yaml_event_t event;
    ~Event() { yaml_event_delete(&event); }
  };

  absl::StatusOr<yaml_event_type_t> Next() {
    current_ = std::make_unique<Event>();
    if (!yaml_parser_parse(&parser_, &current_->event)) {
      current_.reset();
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ":", parser_.problem_mark.line + 1, ": not ", json_ ? "JSON" : "YAML",
                       " (", parser_.problem != nullptr ? parser_.problem : "unreadable", ")"));
    }
    return current_->event.type;
  }

  absl::Status Expect(yaml_event_type_t type) {
    absl::StatusOr<yaml_event_type_t> next = Next();
    if (!next.ok()) return next.status();
    return *next == type ? absl::OkStatus() : Error("unexpected content");
  }

  absl::Status Error(absl::string_view what) const {
    const size_t line = current_ ? current_->event.start_mark.line + 1 : 0;
    return absl::InvalidArgumentError(absl::StrCat(path_, ":", line, ": ", what));
  }

  ConfigValue Scalar() const {
    const yaml_event_t& e = current_->event;
    std::string text(reinterpret_cast<const char*>(e.data.scalar.value), e.data.scalar.length);
    const bool tagged_str =
        e.data.scalar.tag != nullptr &&
        std::strcmp(reinterpret_cast<const char*>(e.data.scalar.tag), YAML_STR_TAG) == 0;
    if (e.data.scalar.style != YAML_PLAIN_SCALAR_STYLE || tagged_str) {
      return ConfigValue::String(std::move(text));
    }
    return TypePlainScalar(text, json_);
  }

  // The value whose first event is current_.
  absl::StatusOr<ConfigValue> Value(int depth) {
    if (depth > kMaxDepth) return Error("nested too deeply for an accelerate config");
    switch (current_->event.type) {
      case YAML_SCALAR_EVENT: return Scalar();
      case YAML_ALIAS_EVENT:
        return Error("YAML aliases (*name) are not read here; write the value out");
      case YAML_SEQUENCE_START_EVENT: {
        ConfigValue list;
        list.kind = ConfigValue::Kind::kList;
        for (;;) {
          absl::StatusOr<yaml_event_type_t> next = Next();
          if (!next.ok()) return next.status();
          if (*next == YAML_SEQUENCE_END_EVENT) return list;
          absl::StatusOr<ConfigValue> item = Value(depth + 1);
          if (!item.ok()) return item.status();
          list.items.push_back(*std::move(item));
        }
      }
      case YAML_MAPPING_START_EVENT: {
        ConfigValue map;
        map.kind = ConfigValue::Kind::kMap;
        for (;;) {
          absl::StatusOr<yaml_event_type_t> next = Next();
          if (!next.ok()) return next.status();
          if (*next == YAML_MAPPING_END_EVENT) return map;
          if (*next != YAML_SCALAR_EVENT) return Error("a key that is not a plain name");
          std::string key = Scalar().PythonStr();
          absl::StatusOr<yaml_event_type_t> value_start = Next();
          if (!value_start.ok()) return value_start.status();
          absl::StatusOr<ConfigValue> value = Value(depth + 1);
          if (!value.ok()) return value.status();
          // As a Python dict: a repeated key keeps its last value.
          bool replaced = false;
          for (auto& [name, old] : map.fields) {
            if (name == key) {
              old = *value;
              replaced = true;
            }
          }
          if (!replaced) map.fields.emplace_back(std::move(key), *std::move(value));
        }
      }
      default: return Error("unexpected content");
    }
  }

  yaml_parser_t parser_;
  std::string path_;
  bool json_;
  std::unique_ptr<Event> current_;
};

// accelerate's is_port_in_use: something accepts a connection on localhost:port.
bool PortInUse(int port) {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return false;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
}

// psutil's cpu_count(logical=False): the distinct cores behind the online CPUs.
int PhysicalCores() {
  std::set<std::string> cores;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/sys/devices/system/cpu", error)) {
    std::ifstream siblings(entry.path() / "topology" / "thread_siblings_list");
    std::string line;
    if (std::getline(siblings, line)) cores.insert(line);
  }
  return cores.empty() ? 1 : static_cast<int>(cores.size());
}

}  // namespace

absl::StatusOr<AccelerateLaunch> LoadAccelerateConfig(const std::string& given, int slurm_nodes,
                                                      const std::set<std::string>& flags) {
  const std::string path = given == "default" ? DefaultAccelerateConfigPath(GetEnv) : given;
  absl::StatusOr<ConfigValue> config = ReadAccelerateConfig(path);
  if (!config.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--accelerate-config: ", config.status().message()));
  }
  char cwd[PATH_MAX];
  AccelerateInputs inputs{.env = GetEnv,
                          .slurm_nodes = slurm_nodes,
                          .flags = flags,
                          .port_in_use = PortInUse,
                          .free_port = PickFreePort,  // accelerate's get_free_port
                          .cwd = getcwd(cwd, sizeof(cwd)) != nullptr ? cwd : ".",
                          .physical_cores = PhysicalCores()};
  return TranslateAccelerateConfig(*config, path, inputs);
}

absl::StatusOr<ConfigValue> ParseAccelerateConfig(const std::string& text,
                                                  const std::string& path) {
  Parser parser(text, path, absl::EndsWith(path, ".json"));
  return parser.Document();
}

absl::StatusOr<ConfigValue> ReadAccelerateConfig(const std::string& path) {
  const std::string fix =
      "give the file `accelerate config` wrote (--accelerate-config default reads "
      "$HF_HOME/accelerate/default_config.yaml)";
  struct stat info {};
  if (stat(path.c_str(), &info) != 0) {
    const int error = errno;
    const std::string why = std::strerror(error);
    if (error == EACCES) return absl::PermissionDeniedError(absl::StrCat(path, ": ", why));
    return absl::NotFoundError(absl::StrCat(path, ": ", why, "; ", fix));
  }
  if (!S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a file; ", fix));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::PermissionDeniedError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  // Read at most one byte past the bound, whatever the file's size says.
  std::string text(kMaxBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": over 1 MiB, no accelerate config; ", fix));
  }
  return ParseAccelerateConfig(text, path);
}

}  // namespace muster
