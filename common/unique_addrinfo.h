// A move-only owner of a getaddrinfo() result list: freed (freeaddrinfo)
// when dropped.
#ifndef MUSTER_COMMON_UNIQUE_ADDRINFO_H_
#define MUSTER_COMMON_UNIQUE_ADDRINFO_H_

#include <netdb.h>

#include <utility>

namespace muster {

class UniqueAddrInfo {
 public:
  UniqueAddrInfo() = default;
  // Takes `list` (from getaddrinfo; may be null).
  explicit UniqueAddrInfo(addrinfo* list) : list_(list) {}
  UniqueAddrInfo(UniqueAddrInfo&& other) noexcept : list_(std::exchange(other.list_, nullptr)) {}
  UniqueAddrInfo& operator=(UniqueAddrInfo&& other) noexcept {
    if (this != &other) reset(std::exchange(other.list_, nullptr));
    return *this;
  }
  UniqueAddrInfo(const UniqueAddrInfo&) = delete;
  UniqueAddrInfo& operator=(const UniqueAddrInfo&) = delete;
  ~UniqueAddrInfo() { reset(); }

  // The first entry (follow ai_next for the rest); null when empty.
  addrinfo* get() const { return list_; }
  addrinfo* release() { return std::exchange(list_, nullptr); }
  void reset(addrinfo* list = nullptr) {
    if (list_ != nullptr) ::freeaddrinfo(list_);
    list_ = list;
  }

 private:
  addrinfo* list_ = nullptr;
};

}  // namespace muster

#endif  // MUSTER_COMMON_UNIQUE_ADDRINFO_H_
