// Built into every executable of a TSan build (MUSTER_SANITIZE=thread), and
// only there: TSan's view of absl::Mutex.
//
// Debian's Abseil is not built with -fsanitize=thread, so TSan cannot see an
// absl::Mutex being taken: its atomics and futex calls are in an
// uninstrumented library, and every access an absl::Mutex guards is reported
// as a race. An instrumented Abseil annotates mutex.cc for TSan; here the
// same annotations wrap the exported functions instead. This file defines
// absl::Mutex's locking functions, CondVar's waits and Notification's Notify
// and waits; the executable exports them (CMakeLists.txt), so the dynamic
// linker binds calls to them, and each forwards to the library's function,
// found with dlsym(RTLD_NEXT), annotated when the call comes from the
// executable's own, instrumented code (see InMainProgram).
//
// What is modelled: lock and unlock, exclusive and shared, try-locks, Await
// and the CondVar waits as an unlock and a relock, a Mutex's destruction,
// and Notify as a release that a successful wait acquires. What is not:
// Await while holding a shared lock (annotated as exclusive: TSan would say
// so) and the inline Notification::HasBeenNotified(), which reads an atomic
// that the library stores to.
#include <dlfcn.h>
#include <link.h>
#include <sanitizer/tsan_interface.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "absl/base/options.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

#define MUSTER_STRINGIFY_(x) #x
#define MUSTER_STRINGIFY(x) MUSTER_STRINGIFY_(x)

// The library's definition of an absl function: the Itanium mangling
// "_ZN" ("_ZNK" for a const member) "4absl" "7debian3" (absl's inline
// namespace) and `rest`.
template <typename Fn>
Fn Real(bool const_member, const char* rest) {
  const std::string ns = MUSTER_STRINGIFY(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name =
      std::string(const_member ? "_ZNK" : "_ZN") + "4absl" + std::to_string(ns.size()) + ns + rest;
  void* fn = dlsym(RTLD_NEXT, name.c_str());
  if (fn == nullptr) {
    std::fprintf(stderr, "tsan_absl_sync: %s is not in Abseil: %s\n", name.c_str(), dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(fn);
}

// `real`, the library's function; a member function is called as a function
// of `this` and its arguments.
#define MUSTER_REAL(ret, rest, ...) static const auto real = Real<ret (*)(__VA_ARGS__)>(false, rest)
#define MUSTER_REAL_CONST(ret, rest, ...) \
  static const auto real = Real<ret (*)(__VA_ARGS__)>(true, rest)

// Only calls made from instrumented code are annotated: ours, and the parts
// of gRPC and Abseil inlined into it from their headers. The libraries' own
// calls (gRPC's internal locks, Notify's lock) are left as TSan sees all of
// their code: not at all. Annotating those would show TSan objects that the
// libraries hand between their threads with synchronization it cannot see.
// The instrumented code is the executable's: everything else in the process
// is Debian's.
struct Range {
  uintptr_t begin = UINTPTR_MAX;
  uintptr_t end = 0;
};

int AddMainProgram(dl_phdr_info* info, size_t, void* data) {
  auto* range = static_cast<Range*>(data);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& segment = info->dlpi_phdr[i];
    if (segment.p_type != PT_LOAD || (segment.p_flags & PF_X) == 0) continue;
    const uintptr_t begin = info->dlpi_addr + segment.p_vaddr;
    range->begin = std::min(range->begin, begin);
    range->end = std::max(range->end, begin + segment.p_memsz);
  }
  return 1;  // the main program comes first: stop there
}

bool InMainProgram(const void* caller) {
  static const Range range = [] {
    Range r;
    dl_iterate_phdr(AddMainProgram, &r);
    return r;
  }();
  const auto pc = reinterpret_cast<uintptr_t>(caller);
  return pc >= range.begin && pc < range.end;
}

// Set while a call forwarded from here runs in the library: a function it
// calls through the PLT arrives here too, and when that is a tail call
// (AwaitWithTimeout jumps to AwaitWithDeadline) the return address is still
// the instrumented caller's.
thread_local bool t_in_library = false;

// Marks the thread as in the library for its lifetime; says whether the
// call it wraps is to be annotated.
class Forwarding {
 public:
  explicit Forwarding(const void* caller)
      : outermost_(!t_in_library), annotated_(outermost_ && InMainProgram(caller)) {
    t_in_library = true;
  }
  ~Forwarding() {
    if (outermost_) t_in_library = false;
  }
  Forwarding(const Forwarding&) = delete;
  Forwarding& operator=(const Forwarding&) = delete;
  bool annotated() const { return annotated_; }

 private:
  const bool outermost_;
  const bool annotated_;
};

#define MUSTER_CALLER __builtin_return_address(0)

// Around a call that takes a lock: `flags` as for __tsan_mutex_pre_lock.
template <typename Call>
auto Locking(const void* caller, void* mu, unsigned flags, Call call) {
  Forwarding forwarding(caller);
  if (!forwarding.annotated()) return call();
  __tsan_mutex_pre_lock(mu, flags);
  auto result = call();
  if constexpr (std::is_same_v<decltype(result), bool>) {
    const bool failed = (flags & __tsan_mutex_try_lock) && !result;
    __tsan_mutex_post_lock(mu, failed ? flags | __tsan_mutex_try_lock_failed : flags, 0);
  } else {
    __tsan_mutex_post_lock(mu, flags, 0);
  }
  return result;
}

template <typename Call>
void Unlocking(const void* caller, void* mu, unsigned flags, Call call) {
  Forwarding forwarding(caller);
  if (forwarding.annotated()) __tsan_mutex_pre_unlock(mu, flags);
  call();
  if (forwarding.annotated()) __tsan_mutex_post_unlock(mu, flags);
}

// Around a call that releases a held lock and takes it again before it returns.
template <typename Call>
auto Relocking(const void* caller, void* mu, Call call) {
  Forwarding forwarding(caller);
  if (!forwarding.annotated()) return call();
  __tsan_mutex_pre_unlock(mu, 0);
  __tsan_mutex_post_unlock(mu, 0);
  __tsan_mutex_pre_lock(mu, 0);
  auto result = call();
  __tsan_mutex_post_lock(mu, 0, 0);
  return result;
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

Mutex::~Mutex() {
  MUSTER_REAL(void, "5MutexD2Ev", Mutex*);
  Forwarding forwarding(MUSTER_CALLER);
  if (forwarding.annotated()) __tsan_mutex_destroy(this, __tsan_mutex_not_static);
  real(this);
}

void Mutex::Lock() {
  MUSTER_REAL(void, "5Mutex4LockEv", Mutex*);
  Locking(MUSTER_CALLER, this, 0, [&] { return (real(this), 0); });
}

void Mutex::ReaderLock() {
  MUSTER_REAL(void, "5Mutex10ReaderLockEv", Mutex*);
  Locking(MUSTER_CALLER, this, __tsan_mutex_read_lock, [&] { return (real(this), 0); });
}

void Mutex::Unlock() {
  MUSTER_REAL(void, "5Mutex6UnlockEv", Mutex*);
  Unlocking(MUSTER_CALLER, this, 0, [&] { real(this); });
}

void Mutex::ReaderUnlock() {
  MUSTER_REAL(void, "5Mutex12ReaderUnlockEv", Mutex*);
  Unlocking(MUSTER_CALLER, this, __tsan_mutex_read_lock, [&] { real(this); });
}

bool Mutex::TryLock() {
  MUSTER_REAL(bool, "5Mutex7TryLockEv", Mutex*);
  return Locking(MUSTER_CALLER, this, __tsan_mutex_try_lock, [&] { return real(this); });
}

bool Mutex::ReaderTryLock() {
  MUSTER_REAL(bool, "5Mutex13ReaderTryLockEv", Mutex*);
  return Locking(MUSTER_CALLER, this, __tsan_mutex_try_read_lock, [&] { return real(this); });
}

// The LockWhen family holds the lock when it returns, whether or not the
// condition became true.
void Mutex::LockWhen(const Condition& cond) {
  MUSTER_REAL(void, "5Mutex8LockWhenERKNS0_9ConditionE", Mutex*, const Condition&);
  Locking(MUSTER_CALLER, this, 0, [&] { return (real(this, cond), 0); });
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  MUSTER_REAL(bool, "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE", Mutex*,
              const Condition&, Duration);
  return Locking(MUSTER_CALLER, this, 0, [&] { return real(this, cond, timeout); });
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  MUSTER_REAL(bool, "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE", Mutex*,
              const Condition&, Time);
  return Locking(MUSTER_CALLER, this, 0, [&] { return real(this, cond, deadline); });
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  MUSTER_REAL(void, "5Mutex14ReaderLockWhenERKNS0_9ConditionE", Mutex*, const Condition&);
  Locking(MUSTER_CALLER, this, __tsan_mutex_read_lock, [&] { return (real(this, cond), 0); });
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  MUSTER_REAL(bool, "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE", Mutex*,
              const Condition&, Duration);
  return Locking(MUSTER_CALLER, this, __tsan_mutex_read_lock,
                 [&] { return real(this, cond, timeout); });
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  MUSTER_REAL(bool, "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE", Mutex*,
              const Condition&, Time);
  return Locking(MUSTER_CALLER, this, __tsan_mutex_read_lock,
                 [&] { return real(this, cond, deadline); });
}

void Mutex::Await(const Condition& cond) {
  MUSTER_REAL(void, "5Mutex5AwaitERKNS0_9ConditionE", Mutex*, const Condition&);
  Relocking(MUSTER_CALLER, this, [&] { return (real(this, cond), 0); });
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  MUSTER_REAL(bool, "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE", Mutex*,
              const Condition&, Duration);
  return Relocking(MUSTER_CALLER, this, [&] { return real(this, cond, timeout); });
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  MUSTER_REAL(bool, "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE", Mutex*,
              const Condition&, Time);
  return Relocking(MUSTER_CALLER, this, [&] { return real(this, cond, deadline); });
}

void CondVar::Wait(Mutex* mu) {
  MUSTER_REAL(void, "7CondVar4WaitEPNS0_5MutexE", CondVar*, Mutex*);
  Relocking(MUSTER_CALLER, mu, [&] { return (real(this, mu), 0); });
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  MUSTER_REAL(bool, "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE", CondVar*, Mutex*,
              Duration);
  return Relocking(MUSTER_CALLER, mu, [&] { return real(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  MUSTER_REAL(bool, "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE", CondVar*, Mutex*, Time);
  return Relocking(MUSTER_CALLER, mu, [&] { return real(this, mu, deadline); });
}

// A notification's fast paths read an atomic the library wrote: no lock for
// TSan to see. Notify releases, and a wait that saw it acquires.
void Notification::Notify() {
  MUSTER_REAL(void, "12Notification6NotifyEv", Notification*);
  Forwarding forwarding(MUSTER_CALLER);
  if (forwarding.annotated()) __tsan_release(this);
  real(this);
}

void Notification::WaitForNotification() const {
  MUSTER_REAL_CONST(void, "12Notification19WaitForNotificationEv", const Notification*);
  Forwarding forwarding(MUSTER_CALLER);
  real(this);
  if (forwarding.annotated()) __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  MUSTER_REAL_CONST(bool, "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE",
                    const Notification*, Duration);
  Forwarding forwarding(MUSTER_CALLER);
  const bool notified = real(this, timeout);
  if (forwarding.annotated() && notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  MUSTER_REAL_CONST(bool, "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE",
                    const Notification*, Time);
  Forwarding forwarding(MUSTER_CALLER);
  const bool notified = real(this, deadline);
  if (forwarding.annotated() && notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
