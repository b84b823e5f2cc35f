// A loopback port held for a server that a test starts later: the C++ side
// of tests/integration/harness.py reserve_port().
#ifndef MUSTER_TESTS_RESERVED_PORT_H_
#define MUSTER_TESTS_RESERVED_PORT_H_

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>

#include "common/unique_handle.h"

namespace muster {

// Holds a port, bound with SO_REUSEADDR and never listening, until dropped:
// no bind to port 0 meanwhile, by this test or one running beside it, is
// handed it. Connecting to it is refused, as to a free port, and a server
// that sets SO_REUSEADDR too (gRPC does) can still listen on it.
class ReservedPort {
 public:
  ReservedPort() : fd_(Bind(0)) {
    sockaddr_in addr = {};
    socklen_t length = sizeof addr;
    if (fd_.valid() && getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&addr), &length) == 0) {
      port_ = ntohs(addr.sin_port);
    }
  }

  // 0 when no port could be bound.
  int port() const { return port_; }

  // A listener on the port, for a test that plays the server itself; the
  // port stays held when it is closed. Invalid when it could not listen.
  UniqueFd Listen() const {
    UniqueFd listener = Bind(port_);
    if (listener.valid() && listen(listener.get(), 8) != 0) listener.reset();
    return listener;
  }

 private:
  // A socket bound to 127.0.0.1:`port` with SO_REUSEADDR; invalid on failure.
  static UniqueFd Bind(int port) {
    UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const int one = 1;
    if (!fd.valid() || setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      fd.reset();
    }
    return fd;
  }

  UniqueFd fd_;
  int port_ = 0;
};

}  // namespace muster

#endif  // MUSTER_TESTS_RESERVED_PORT_H_
