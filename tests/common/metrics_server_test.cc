// The /metrics endpoint: serves what it is given over HTTP, on the address
// asked; a bad address or a taken port is an error that says what to give.
#include "common/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/counter.h>
#include <prometheus/registry.h>

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// GET `path` from 127.0.0.1:port; the whole answer, headers and all.
std::string Get(int port, const std::string& path = "/metrics", const std::string& headers = "") {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string answer;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) {
    const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\n", headers, "\r\n");
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      for (ssize_t n; (n = read(fd, buffer, sizeof buffer)) > 0;) answer.append(buffer, n);
    }
  }
  close(fd);
  return answer;
}

TEST(MetricsServerTest, ServesItsCollectablesAtMetrics) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start("127.0.0.1", 0, "--metrics-listen", "--metrics-port");
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  EXPECT_EQ((*server)->url(), absl::StrCat("http://127.0.0.1:", (*server)->port(), "/metrics"));
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter()
      .Name("test_things_total")
      .Help("Things")
      .Register(*registry)
      .Add({{"kind", "a"}})
      .Increment(3);
  (*server)->Add(registry);
  const std::string answer = Get((*server)->port());
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(answer, HasSubstr("test_things_total{kind=\"a\"} 3\n"));
  EXPECT_THAT(Get((*server)->port(), "/"), HasSubstr(" 404 Not Found\r\n"));
}

TEST(MetricsServerTest, WithAuthOnlyTheRightPasswordIsServed) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start("127.0.0.1", 0, "--metrics-listen", "--metrics-port");
  ASSERT_TRUE(server.ok()) << server.status();
  (*server)->RequireAuth(
      [](const std::string&, const std::string& password) { return password == "secret"; });
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter().Name("test_total").Help("Test").Register(*registry).Add({});
  (*server)->Add(registry);
  EXPECT_THAT(Get((*server)->port()), HasSubstr(" 401 "));
  // "muster:guess", then "muster:secret".
  EXPECT_THAT(Get((*server)->port(), "/metrics", "Authorization: Basic bXVzdGVyOmd1ZXNz\r\n"),
              HasSubstr(" 401 "));
  const std::string answer =
      Get((*server)->port(), "/metrics", "Authorization: Basic bXVzdGVyOnNlY3JldA==\r\n");
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(answer, HasSubstr("test_total 0\n"));
}

TEST(MetricsServerTest, ABadAddressOrPortSaysWhatToGive) {
  for (const char* bad : {"localhost", "", "10.0.0.256", "[::1]", "127.0.0.1:9100"}) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> server =
        MetricsServer::Start(bad, 9100, "--metrics-listen", "--metrics-port");
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(server.status().message(), HasSubstr("give an IPv4 address")) << bad;
  }
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start("127.0.0.1", 70000, "--metrics-listen", "--metrics-port");
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("--metrics-port 70000: give a port number"));
}

TEST(MetricsServerTest, ATakenPortIsUnavailable) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> first =
      MetricsServer::Start("127.0.0.1", 0, "--metrics-listen", "--metrics-port");
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<MetricsServer>> second =
      MetricsServer::Start("127.0.0.1", (*first)->port(), "--metrics-listen", "--metrics-port");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("--metrics-port ", (*first)->port(), ": cannot listen on")));
  EXPECT_THAT(second.status().message(), HasSubstr("give another"));
}

// Debian's civetweb has no IPv6: say so, rather than its "invalid port spec".
TEST(MetricsServerTest, IPv6IsServedOrRefusedWithTheReason) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start("::1", 0, "--metrics-listen", "--metrics-port");
  if (server.ok()) {
    EXPECT_EQ((*server)->url(), absl::StrCat("http://[::1]:", (*server)->port(), "/metrics"));
    return;
  }
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("--metrics-listen ::1: the metrics' HTTP "
                                                   "server (civetweb, as built here) has no IPv6"));
}

}  // namespace
}  // namespace muster
