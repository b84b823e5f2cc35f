// Certificates made by openssl at test time, for tests of TLS between a real
// gRPC server and client on loopback. Tests skip where openssl is missing.
#ifndef MUSTER_TESTS_SUPPORT_CERTIFICATES_H_
#define MUSTER_TESTS_SUPPORT_CERTIFICATES_H_

#include <cstdlib>
#include <string>

namespace muster::rdzv {

inline constexpr char kOpenssl[] = "/usr/bin/openssl";

// Runs a shell command in `dir`; true if it exited 0. Its output goes to
// dir/openssl.log.
inline bool Shell(const std::string& dir, const std::string& command) {
  return std::system(("cd '" + dir + "' && (" + command + ") >openssl.log 2>&1").c_str()) == 0;
}

// Makes, in `dir`: ca.pem (ca.key), which signs server.pem (server.key;
// subjectAltName IP 127.0.0.1) and client.pem (client.key); other-ca.pem,
// which signs nothing of theirs. Keys are mode 600.
inline bool MakeCertificates(const std::string& dir) {
  const std::string ca =
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
      "-days 1 -subj /CN=";
  auto leaf = [](const std::string& name, const std::string& extension) {
    return "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=" + name +
           " -keyout " + name + ".key -out " + name + ".csr && printf '" + extension + "' > " +
           name + ".ext && openssl x509 -req -in " + name +
           ".csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -extfile " + name + ".ext -out " +
           name + ".pem";
  };
  return Shell(dir, ca + "muster-test-ca -keyout ca.key -out ca.pem") &&
         Shell(dir, ca + "other-ca -keyout other-ca.key -out other-ca.pem") &&
         Shell(dir, leaf("server", "subjectAltName=IP:127.0.0.1\\n")) &&
         Shell(dir, leaf("client", "extendedKeyUsage=clientAuth\\n")) &&
         Shell(dir, "chmod 600 server.key client.key");
}

}  // namespace muster::rdzv

#endif  // MUSTER_TESTS_SUPPORT_CERTIFICATES_H_
