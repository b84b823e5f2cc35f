// A TCP port free on this host a moment ago: the one the kernel gives a
// socket bound to port 0 on every address, then closed. The caller's use of
// it can still race another process's; bind it as late as possible.
#ifndef MUSTER_COMMON_FREE_PORT_H_
#define MUSTER_COMMON_FREE_PORT_H_

namespace muster {

// The port, or 0 when no socket could be bound.
int PickFreePort();

}  // namespace muster

#endif  // MUSTER_COMMON_FREE_PORT_H_
