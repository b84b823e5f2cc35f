// Move-only owners of handles that a C library hands out (a descriptor, a
// getaddrinfo list, a directory stream): each is released exactly once, by
// the library's own release call, when its owner is dropped or reset.
#ifndef MUSTER_COMMON_UNIQUE_HANDLE_H_
#define MUSTER_COMMON_UNIQUE_HANDLE_H_

#include <dirent.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <unistd.h>

#include <utility>

namespace muster {

// Owns one `T` (a pointer or a descriptor), released by calling `Release`
// on it. `kEmpty` is the value that holds nothing (null unless given; -1
// for a descriptor): it is never released, and a failed create call that
// returns it leaves the owner empty.
//
// Thread safety: none; an owner is used by one thread at a time.
template <typename T, auto Release, T kEmpty = T{}>
class UniqueHandle {
 public:
  UniqueHandle() = default;
  // Takes `handle`, which may be `kEmpty`.
  explicit UniqueHandle(T handle) : handle_(handle) {}
  UniqueHandle(UniqueHandle&& other) noexcept : handle_(std::exchange(other.handle_, kEmpty)) {}
  UniqueHandle& operator=(UniqueHandle&& other) noexcept {
    if (this != &other) reset(std::exchange(other.handle_, kEmpty));
    return *this;
  }
  UniqueHandle(const UniqueHandle&) = delete;
  UniqueHandle& operator=(const UniqueHandle&) = delete;
  ~UniqueHandle() { reset(); }

  T get() const { return handle_; }
  bool valid() const { return handle_ != kEmpty; }
  // Gives the handle up unreleased; the owner is left empty.
  T release() { return std::exchange(handle_, kEmpty); }
  // Releases what is held, then takes `handle`.
  void reset(T handle = kEmpty) {
    if (handle_ != kEmpty) Release(handle_);
    handle_ = handle;
  }
  // Releases what is held and returns where a create call that writes its
  // result through a pointer (getifaddrs, cudaStreamCreate) puts the new one.
  T* out() {
    reset();
    return &handle_;
  }

 private:
  T handle_ = kEmpty;
};

// A file descriptor: closed.
using UniqueFd = UniqueHandle<int, ::close, -1>;
// A getaddrinfo() list, get() its first entry (follow ai_next): freeaddrinfo.
using UniqueAddrInfo = UniqueHandle<addrinfo*, ::freeaddrinfo>;
// A getifaddrs() list, this machine's interface addresses (follow ifa_next): freeifaddrs.
using UniqueIfAddrs = UniqueHandle<ifaddrs*, ::freeifaddrs>;
// A directory stream from opendir or fdopendir: closedir, which closes its descriptor too.
using UniqueDir = UniqueHandle<DIR*, ::closedir>;

}  // namespace muster

#endif  // MUSTER_COMMON_UNIQUE_HANDLE_H_
