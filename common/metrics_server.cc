#include "common/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <exception>
#include <utility>

#include <civetweb.h>
#include <prometheus/exposer.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/constant_time.h"

namespace muster {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen,
                                                                    int port,
                                                                    absl::string_view listen_option,
                                                                    absl::string_view port_option) {
  in6_addr parsed;
  const bool v6 = inet_pton(AF_INET6, listen.c_str(), &parsed) == 1;
  if (!v6 && inet_pton(AF_INET, listen.c_str(), &parsed) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(listen_option, " ", listen,
                     ": give an IPv4 address of this host: 127.0.0.1 (the default: this host "
                     "only), 0.0.0.0 (every interface), or one interface's address"));
  }
  // Debian's civetweb, under prometheus-cpp's exposer, is built without
  // IPv6 (mg_check_feature's 8); it would only say the port spec is bad.
  constexpr unsigned kCivetwebIpv6 = 8;
  if (v6 && mg_check_feature(kCivetwebIpv6) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        listen_option, " ", listen,
        ": the metrics' HTTP server (civetweb, as built here) has no IPv6; give an IPv4 "
        "address: 127.0.0.1 (this host only) or 0.0.0.0 (every interface)"));
  }
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(port_option, " ", port, ": give a port number 0..65535 (0: any free one)"));
  }
  const std::string address = v6 ? absl::StrCat("[", listen, "]") : listen;
  const std::string option = absl::StrCat(port_option, " ", port);
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  try {
    server->exposer_ = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{"listening_ports", absl::StrCat(address, ":", port),
                                 // Scrapes are small and rare: four threads, each held
                                 // at most 5 s by a client that connects and sends nothing.
                                 "num_threads", "4", "request_timeout_ms", "5000"});
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat(option, ": cannot listen on ", address, ":", port, " (", e.what(),
                     "); the port may be taken or the address not this host's: give another"));
  }
  const std::vector<int> ports = server->exposer_->GetListeningPorts();
  server->port_ = ports.empty() ? port : ports.front();
  server->url_ = absl::StrCat("http://", address, ":", server->port_, "/metrics");
  return server;
}

MetricsServer::~MetricsServer() = default;

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsEndpoint& endpoint) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> started =
      Start(endpoint.listen, endpoint.port, endpoint.listen_option, endpoint.port_option);
  if (!started.ok() || endpoint.password.empty()) return started;
  (*started)->RequireAuth(
      [password = endpoint.password](const std::string&, const std::string& given) {
        return ConstantTimeEquals(given, password);
      });
  return started;
}

void MetricsServer::LeaveToExit(std::unique_ptr<MetricsServer> server) {
  // Never destroyed: a static's destructor would wait the 2 s at exit.
  // What it serves goes now (the exposer holds only weak pointers): its
  // owners' destructors run as they would have (an event log's writer
  // writes what waits), and a scrape during the exit finds nothing.
  server->collectables_.clear();
  static auto* const left = new std::vector<std::unique_ptr<MetricsServer>>();
  ABSL_CONST_INIT static absl::Mutex mu(absl::kConstInit);
  absl::MutexLock lock(&mu);
  left->push_back(std::move(server));
}

void MetricsServer::RequireAuth(std::function<bool(const std::string&, const std::string&)> check) {
  exposer_->RegisterAuth(std::move(check), "muster");
}

void MetricsServer::Add(std::shared_ptr<prometheus::Collectable> collectable) {
  exposer_->RegisterCollectable(collectable);
  collectables_.push_back(std::move(collectable));
}

}  // namespace muster
