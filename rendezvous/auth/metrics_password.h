// Who may scrape /metrics: the password of musterd's and an agent's metrics
// endpoints (common/metrics_server.h serves them).
#ifndef MUSTER_RENDEZVOUS_AUTH_METRICS_PASSWORD_H_
#define MUSTER_RENDEZVOUS_AUTH_METRICS_PASSWORD_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muster::rdzv {

// The password a metrics endpoint asks for (HTTP basic auth); empty: none.
// `password_file` (the metrics' own, read as a token file is, see token.h)
// if given; else the job's `token`, which only a listener on 127.0.0.0/8
// may use: the metrics are plain HTTP, and a scrape from another host would
// carry the token in clear text. `file_option` and `listen_option` name the
// settings in messages. Errors (kInvalidArgument or ReadTokenFile's, naming
// the fix): the file cannot be used; a token with a listener beyond
// loopback.
absl::StatusOr<std::string> MetricsPassword(const std::string& password_file,
                                            const std::string& token, const std::string& listen,
                                            absl::string_view file_option,
                                            absl::string_view listen_option);

// Whether `listen` is an IPv4 address on 127.0.0.0/8: a listener only this
// host reaches.
bool IsLoopbackListen(const std::string& listen);

// For a start line: how a metrics endpoint asks for its password, as
// MetricsPassword chose it ("" for none). `file_option` names the setting.
std::string DescribeMetricsAuth(absl::string_view password_file, absl::string_view password,
                                absl::string_view file_option);

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_AUTH_METRICS_PASSWORD_H_
