// How many of gRPC's callback threads this process runs (callback_ticker.h,
// "The end"): they run while some channel or server that made a callback
// call lives, and are joined by whoever drops the last one.
#ifndef MUSTER_TESTS_RENDEZVOUS_GRPC_CALLBACK_THREADS_H_
#define MUSTER_TESTS_RENDEZVOUS_GRPC_CALLBACK_THREADS_H_

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace muster::rdzv {

// By the name gRPC 1.51 gives them (completion_queue_cc.cc). A thread
// already exiting is not counted: pthread_join returns once the thread has
// left its memory behind (the kernel's clear of its tid), a few steps
// before the kernel takes it out of /proc/self/task, so the thread of a
// queue just joined can still be listed; the kernel has marked it
// PF_EXITING by then (the flags, field 9 of its stat). A thread that still
// serves a queue never is.
inline int CallbackThreads() {
  constexpr unsigned long kPfExiting = 0x4;  // include/linux/sched.h
  int count = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    if (!std::getline(comm, name) || name != "nexting_thread") continue;
    std::ifstream stat_file(task.path() / "stat");
    std::string stat;
    std::getline(stat_file, stat);
    const size_t name_end = stat.rfind(')');
    if (name_end == std::string::npos) continue;  // gone while read
    std::istringstream fields(stat.substr(name_end + 1));
    std::string state;
    unsigned long flags = 0;
    fields >> state;  // field 3
    for (int field = 4; field < 9 && fields >> name; ++field) {
    }
    if (!(fields >> flags) || (flags & kPfExiting) != 0) continue;
    ++count;
  }
  return count;
}

}  // namespace muster::rdzv

#endif  // MUSTER_TESTS_RENDEZVOUS_GRPC_CALLBACK_THREADS_H_
