#include "common/file_system.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdio>

namespace muster {

FileSystem& FileSystem::Default() {
  static FileSystem* const files = new FileSystem();
  return *files;
}

int FileSystem::Open(const std::string& path, int flags, mode_t mode) {
  return open(path.c_str(), flags, mode);
}

ssize_t FileSystem::PRead(int fd, void* data, size_t size, off_t offset) {
  return pread(fd, data, size, offset);
}

ssize_t FileSystem::PWrite(int fd, const void* data, size_t size, off_t offset) {
  return pwrite(fd, data, size, offset);
}

int FileSystem::FSync(int fd) { return fsync(fd); }

int FileSystem::FDataSync(int fd) { return fdatasync(fd); }

int FileSystem::FTruncate(int fd, off_t size) { return ftruncate(fd, size); }

int FileSystem::FChmod(int fd, mode_t mode) { return fchmod(fd, mode); }

int FileSystem::Flock(int fd, int operation) { return flock(fd, operation); }

int FileSystem::MkDir(const std::string& path, mode_t mode) { return mkdir(path.c_str(), mode); }

int FileSystem::Stat(const std::string& path, struct stat* st) { return stat(path.c_str(), st); }

int FileSystem::Rename(const std::string& from, const std::string& to) {
  return rename(from.c_str(), to.c_str());
}

int FileSystem::Unlink(const std::string& path) { return unlink(path.c_str()); }

}  // namespace muster
