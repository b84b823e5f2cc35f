// A move-only owner of an open directory stream (opendir): closed
// (closedir, which closes its descriptor too) when dropped.
#ifndef MUSTER_COMMON_UNIQUE_DIR_H_
#define MUSTER_COMMON_UNIQUE_DIR_H_

#include <dirent.h>

#include <utility>

namespace muster {

class UniqueDir {
 public:
  UniqueDir() = default;
  // Takes `dir` (from opendir or fdopendir; null when that failed).
  explicit UniqueDir(DIR* dir) : dir_(dir) {}
  UniqueDir(UniqueDir&& other) noexcept : dir_(std::exchange(other.dir_, nullptr)) {}
  UniqueDir& operator=(UniqueDir&& other) noexcept {
    if (this != &other) reset(std::exchange(other.dir_, nullptr));
    return *this;
  }
  UniqueDir(const UniqueDir&) = delete;
  UniqueDir& operator=(const UniqueDir&) = delete;
  ~UniqueDir() { reset(); }

  DIR* get() const { return dir_; }
  bool valid() const { return dir_ != nullptr; }
  DIR* release() { return std::exchange(dir_, nullptr); }
  void reset(DIR* dir = nullptr) {
    if (dir_ != nullptr) ::closedir(dir_);
    dir_ = dir;
  }

 private:
  DIR* dir_ = nullptr;
};

}  // namespace muster

#endif  // MUSTER_COMMON_UNIQUE_DIR_H_
