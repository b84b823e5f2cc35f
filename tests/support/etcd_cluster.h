// gtest suites on a real 3-member etcd cluster for a test process
// (etcd_test_cluster.h), gone with the process however that ends: skipped
// where etcd-server or etcd-client is not installed.
#ifndef MUSTER_TESTS_SUPPORT_ETCD_CLUSTER_H_
#define MUSTER_TESTS_SUPPORT_ETCD_CLUSTER_H_

#include <gtest/gtest.h>

#include "rendezvous/etcd/client.h"
#include "tests/support/etcd_test_cluster.h"

namespace muster::etcd {

inline bool SuiteFailed() {
  const ::testing::TestSuite* suite = ::testing::UnitTest::GetInstance()->current_test_suite();
  return suite != nullptr && suite->Failed();
}

// A suite on one plaintext cluster for the test process (ctest runs one
// test per process). A test that derives from it and has a SetUp of its own
// calls this one first, and returns if it skipped or failed.
class PlaintextClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_.Start(); }
  static void TearDownTestSuite() { EXPECT_TRUE(cluster_.Stop(SuiteFailed()).ok()); }

  // Skips the test where etcd is not installed; fails it where the cluster
  // did not start.
  void SetUp() override {
    if (!cluster_.skip().empty()) GTEST_SKIP() << cluster_.skip();
    ASSERT_TRUE(cluster_.status().ok()) << cluster_.status();
  }
  bool SetUpStopped() const { return IsSkipped() || HasFatalFailure(); }

  // A client's options for the cluster.
  static EtcdOptions Options() {
    EtcdOptions options;
    options.endpoints = cluster_.endpoints();
    return options;
  }

  static inline TestCluster cluster_;
};

}  // namespace muster::etcd

#endif  // MUSTER_TESTS_SUPPORT_ETCD_CLUSTER_H_
