// How many of gRPC's callback threads this process runs (callback_ticker.h,
// "The end"): they run while some channel or server that made a callback
// call lives, and are joined by whoever drops the last one.
#ifndef MUSTER_TESTS_RENDEZVOUS_GRPC_CALLBACK_THREADS_H_
#define MUSTER_TESTS_RENDEZVOUS_GRPC_CALLBACK_THREADS_H_

#include <filesystem>
#include <fstream>
#include <string>

namespace muster::rdzv {

// By the name gRPC 1.51 gives them (completion_queue_cc.cc).
inline int CallbackThreads() {
  int count = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    if (std::getline(comm, name) && name == "nexting_thread") ++count;
  }
  return count;
}

}  // namespace muster::rdzv

#endif  // MUSTER_TESTS_RENDEZVOUS_GRPC_CALLBACK_THREADS_H_
