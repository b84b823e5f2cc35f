#include "rendezvous/auth/metrics_password.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "rendezvous/auth/token.h"

namespace muster::rdzv {

absl::StatusOr<std::string> MetricsPassword(const std::string& password_file,
                                            const std::string& token, const std::string& listen,
                                            absl::string_view file_option,
                                            absl::string_view listen_option) {
  if (!password_file.empty()) {
    absl::StatusOr<std::string> password = ReadTokenFile(password_file);
    if (!password.ok()) {
      return absl::Status(password.status().code(),
                          absl::StrCat(file_option, ": ", password.status().message()));
    }
    return password;
  }
  if (token.empty()) return std::string();
  if (!IsLoopbackListen(listen)) {
    return absl::InvalidArgumentError(absl::StrCat(
        listen_option, " ", listen,
        ": the metrics are plain HTTP and ask for the job's token, so a scrape from another host "
        "would carry the token in clear text; give ",
        file_option, " FILE, a password for the metrics only (a mode 600 file of one line)"));
  }
  return token;
}

bool IsLoopbackListen(const std::string& listen) {
  in_addr address;
  return inet_pton(AF_INET, listen.c_str(), &address) == 1 && (ntohl(address.s_addr) >> 24) == 127;
}

std::string DescribeMetricsAuth(absl::string_view password_file, absl::string_view password,
                                absl::string_view file_option) {
  if (!password_file.empty()) return absl::StrCat("HTTP basic auth, ", file_option, "'s password");
  if (!password.empty()) return "HTTP basic auth, the token as password";
  return "";
}

}  // namespace muster::rdzv
