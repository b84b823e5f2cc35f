// The HTTP endpoint Prometheus scrapes (musterd --metrics-port, an agent's
// --rdzv-conf metrics_port=): prometheus-cpp's pull exposer, serving what
// its collectables hold at /metrics, from threads of its own.
#ifndef MUSTER_COMMON_METRICS_SERVER_H_
#define MUSTER_COMMON_METRICS_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/collectable.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace prometheus {
class Exposer;
}

namespace muster {

// Where and how a metrics endpoint serves: musterd's --metrics-* flags, an
// agent's --rdzv-conf metrics_*.
struct MetricsEndpoint {
  std::string listen;
  int port = 0;
  // HTTP basic auth with any user name and this password; empty: none.
  std::string password;
  // The settings' names, for messages ("--metrics-listen", "--metrics-port").
  std::string listen_option;
  std::string port_option;
};

class MetricsServer {
 public:
  // Start(listen, port, ...) below, asking every scrape for the password
  // when there is one (compared in constant time).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const MetricsEndpoint& endpoint);

  // Listens on listen:port (an IP address; IPv6 only where civetweb was
  // built with it, which Debian's is not; port 0 picks one).
  // `listen_option` and `port_option` name the settings in messages
  // ("--metrics-listen", "--metrics-port"). Errors, naming the fix:
  // kInvalidArgument `listen` is not an IP address or `port` no port;
  // kUnavailable listen:port cannot be listened on (the port is taken,
  // the address is not this host's).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& listen, int port,
                                                              absl::string_view listen_option,
                                                              absl::string_view port_option);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Leaves `server` listening until the process exits, for a process about
  // to exit: stopping civetweb takes up to 2 s (its listening thread looks
  // for the stop every 2 s), which an exit need not wait for. What it
  // served is let go now; later scrapes get an empty page.
  static void LeaveToExit(std::unique_ptr<MetricsServer> server);

  // Asks every scrape for HTTP basic auth that `check(user, password)`
  // accepts; any other gets 401.
  void RequireAuth(std::function<bool(const std::string&, const std::string&)> check);

  // Serves `collectable` too, and keeps it alive as long as this serves.
  void Add(std::shared_ptr<prometheus::Collectable> collectable);
  int port() const { return port_; }
  // http://ADDR:PORT/metrics, as a scraper would be given it.
  const std::string& url() const { return url_; }

 private:
  MetricsServer() = default;
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  std::unique_ptr<prometheus::Exposer> exposer_;  // after collectables_: stopped first
  int port_ = 0;
  std::string url_;
};

}  // namespace muster

#endif  // MUSTER_COMMON_METRICS_SERVER_H_
