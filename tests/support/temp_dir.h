// What tests and benchmarks share for files: a directory of their own under
// /tmp, gone with everything in it when they are done, and whole-file reads
// and writes.
#ifndef MUSTER_TESTS_SUPPORT_TEMP_DIR_H_
#define MUSTER_TESTS_SUPPORT_TEMP_DIR_H_

#include <string>

#include "absl/strings/string_view.h"

namespace muster::support {

// A fresh directory, /tmp/PREFIX-XXXXXX (mode 0700), removed with its
// contents when this goes, unless Keep() was called. Aborts the process
// where mkdtemp(3) fails: nothing a test does would mean anything then.
//
// Thread safety: path() and Path() from any thread.
class TempDir {
 public:
  explicit TempDir(absl::string_view prefix = "muster-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path()/name.
  std::string Path(absl::string_view name) const;
  // Left in place when this goes (a failed run's logs), and said so on stderr.
  void Keep() { keep_ = true; }

 private:
  std::string path_;
  bool keep_ = false;
};

// The whole of the file at `path`; "" where it cannot be read (a test then
// fails on what it expected in it).
std::string ReadFile(const std::string& path);

// Writes `contents` to `path`, replacing what was there; false where it cannot.
bool WriteFile(const std::string& path, absl::string_view contents);

}  // namespace muster::support

#endif  // MUSTER_TESTS_SUPPORT_TEMP_DIR_H_
