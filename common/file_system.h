// The file operations of the code that must survive a full disk or a failed
// sync (musterd's journal), behind an interface a test can fail one call of
// at a time: ENOSPC on the tenth write, a short write, an fdatasync that
// reports EIO. leveldb's Env is the model, cut to what the callers use.
//
// Each method is the system call of its name and returns what it returns:
// -1 (or a negative count) with errno set on failure. The default
// implementations make the calls; a test's subclass overrides the ones it
// breaks and calls FileSystem's for the rest.
//
// Thread safety: Default() is safe from any thread; a subclass says.
#ifndef MUSTER_COMMON_FILE_SYSTEM_H_
#define MUSTER_COMMON_FILE_SYSTEM_H_

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <string>

namespace muster {

class FileSystem {
 public:
  // The system's: every method makes its call.
  static FileSystem& Default();

  FileSystem() = default;
  FileSystem(const FileSystem&) = delete;
  FileSystem& operator=(const FileSystem&) = delete;
  virtual ~FileSystem() = default;

  virtual int Open(const std::string& path, int flags, mode_t mode);
  virtual ssize_t PRead(int fd, void* data, size_t size, off_t offset);
  virtual ssize_t PWrite(int fd, const void* data, size_t size, off_t offset);
  virtual int FSync(int fd);
  virtual int FDataSync(int fd);
  virtual int FTruncate(int fd, off_t size);
  virtual int FChmod(int fd, mode_t mode);
  virtual int Flock(int fd, int operation);
  virtual int MkDir(const std::string& path, mode_t mode);
  virtual int Stat(const std::string& path, struct stat* st);
  virtual int Rename(const std::string& from, const std::string& to);
  virtual int Unlink(const std::string& path);
};

}  // namespace muster

#endif  // MUSTER_COMMON_FILE_SYSTEM_H_
