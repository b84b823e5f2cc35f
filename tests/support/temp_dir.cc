#include "tests/support/temp_dir.h"

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace muster::support {

TempDir::TempDir(absl::string_view prefix) {
  std::string pattern = absl::StrCat("/tmp/", prefix, "-XXXXXX");
  if (::mkdtemp(pattern.data()) == nullptr) {
    std::perror(absl::StrCat("mkdtemp ", pattern).c_str());
    std::abort();
  }
  path_ = std::move(pattern);
}

TempDir::~TempDir() {
  if (keep_) {
    std::fprintf(stderr, "kept %s\n", path_.c_str());
    return;
  }
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string TempDir::Path(absl::string_view name) const { return absl::StrCat(path_, "/", name); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool WriteFile(const std::string& path, absl::string_view contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  out.close();
  return !out.fail();
}

}  // namespace muster::support
