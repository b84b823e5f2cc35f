// A move-only owner of a getifaddrs() list (this machine's interface
// addresses): freed (freeifaddrs) when dropped.
#ifndef MUSTER_COMMON_UNIQUE_IFADDRS_H_
#define MUSTER_COMMON_UNIQUE_IFADDRS_H_

#include <ifaddrs.h>

#include <utility>

namespace muster {

class UniqueIfAddrs {
 public:
  UniqueIfAddrs() = default;
  // Takes `list` (from getifaddrs; may be null).
  explicit UniqueIfAddrs(ifaddrs* list) : list_(list) {}
  UniqueIfAddrs(UniqueIfAddrs&& other) noexcept : list_(std::exchange(other.list_, nullptr)) {}
  UniqueIfAddrs& operator=(UniqueIfAddrs&& other) noexcept {
    if (this != &other) reset(std::exchange(other.list_, nullptr));
    return *this;
  }
  UniqueIfAddrs(const UniqueIfAddrs&) = delete;
  UniqueIfAddrs& operator=(const UniqueIfAddrs&) = delete;
  ~UniqueIfAddrs() { reset(); }

  // The first entry (follow ifa_next for the rest); null when empty.
  ifaddrs* get() const { return list_; }
  ifaddrs* release() { return std::exchange(list_, nullptr); }
  void reset(ifaddrs* list = nullptr) {
    if (list_ != nullptr) ::freeifaddrs(list_);
    list_ = list;
  }

 private:
  ifaddrs* list_ = nullptr;
};

}  // namespace muster

#endif  // MUSTER_COMMON_UNIQUE_IFADDRS_H_
