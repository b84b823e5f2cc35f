// The fixture of the state machine's tests: a job's nodes described in
// a line (Spec), requests built one way, and helpers that call the state
// and check that it accepted the call. Every durable change the calls
// make is kept in journal_, for the tests of restarts.
#ifndef MUSTER_TESTS_RENDEZVOUS_RULES_STATE_FIXTURE_H_
#define MUSTER_TESTS_RENDEZVOUS_RULES_STATE_FIXTURE_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "rendezvous/rules/protocol.h"
#include "rendezvous/rules/state.h"

namespace muster::rdzv {

inline const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);
inline absl::Time At(int64_t ms) { return kT0 + absl::Milliseconds(ms); }

inline constexpr int64_t kLastCallMs = 1'000;
inline constexpr int64_t kJoinTimeoutMs = 60'000;
inline constexpr int64_t kHeartbeatMs = 5'000;

inline JobConfig Config(int min, int max, int max_restarts = 3) {
  JobConfig config;
  config.set_min_nodes(min);
  config.set_max_nodes(max);
  config.set_max_restarts(max_restarts);
  config.set_last_call_timeout_ms(kLastCallMs);
  config.set_join_timeout_ms(kJoinTimeoutMs);
  config.set_heartbeat_timeout_ms(kHeartbeatMs);
  return config;
}

// A node as its agent describes it: Spec("a") runs on host "host-a".
struct Spec {
  Spec(const char* node_id) : id(node_id) {}  // implicit: Join({"a"}, ...)
  Spec(std::string node_id) : id(std::move(node_id)) {}
  Spec& Lws(int n) {
    local_world_size = n;
    return *this;
  }
  Spec& Hint(int h) {
    hint = h;
    return *this;
  }
  Spec& Port(int p) {
    port = p;
    return *this;
  }
  Spec& Addr(std::string a) {
    advertised_addr = std::move(a);
    return *this;
  }
  Spec& Host(std::string h) {
    host = std::move(h);
    return *this;
  }
  Spec& StopAllowance(int64_t ms) {
    stop_allowance_ms = ms;
    return *this;
  }
  Spec& PeerPort(int p) {
    peer_port = p;
    return *this;
  }

  std::string id;
  int local_world_size = 1;
  int hint = -1;
  int port = 29500;
  std::string advertised_addr;
  std::string host;  // empty: "host-" + id
  int64_t stop_allowance_ms = 0;
  int peer_port = 0;
};

class StateTest : public ::testing::Test {
 protected:
  explicit StateTest(StateOptions options = {}) : state_(storage_.emplace(options)) {}

  JoinRequest Request(const Spec& spec) const {
    JoinRequest request;
    request.set_job_id(job_);
    *request.mutable_config() = config_;
    NodeInfo* node = request.mutable_node();
    node->set_node_id(spec.id);
    node->set_host(spec.host.empty() ? "host-" + spec.id : spec.host);
    node->set_advertised_addr(spec.advertised_addr);
    node->set_local_world_size(spec.local_world_size);
    node->set_node_rank_hint(spec.hint);
    node->set_master_port_candidate(spec.port);
    node->set_stop_allowance_ms(spec.stop_allowance_ms);
    node->set_peer_port(spec.peer_port);
    // Ignored on a first join; a rejoin must present it.
    request.set_node_secret(SecretOf(spec.id));
    request.set_protocol_version(kProtocolVersion);
    return request;
  }

  absl::Status TryJoin(const Spec& spec, absl::Time now, Effects* effects) {
    const size_t kept = effects->journal.size();
    absl::Status status =
        state_.Join(Request(spec), PeerOf(spec.id), SecretOf(spec.id), now, effects);
    Keep(*effects, kept);
    return status;
  }

  // Adds what `effects` journalled, from record `from` on, to journal_.
  void Keep(const Effects& effects, size_t from = 0) {
    journal_.insert(journal_.end(), effects.journal.begin() + from, effects.journal.end());
  }

  Effects Join(const Spec& spec, absl::Time now) {
    Effects effects;
    absl::Status status = TryJoin(spec, now, &effects);
    EXPECT_TRUE(status.ok()) << spec.id << ": " << status;
    return effects;
  }

  static std::string PeerOf(const std::string& id) { return "peer-" + id; }
  // The secret the test's server draws for node `id`, and its agent presents.
  static std::string SecretOf(const std::string& id) { return "secret-" + id; }

  static Failure MakeFailure(const std::string& node, int rank) {
    Failure failure;
    failure.set_rank(rank);
    failure.set_host("host-" + node);
    failure.set_exit_code(1);
    failure.set_message("boom");
    return failure;
  }

  Effects Fail(const std::string& node, int64_t round, absl::Time now, int rank = 0) {
    Effects effects;
    absl::Status status = state_.ReportFailure({job_, node}, SecretOf(node), round,
                                               MakeFailure(node, rank), now, &effects);
    EXPECT_TRUE(status.ok()) << status;
    Keep(effects);
    return effects;
  }

  Effects Done(const std::string& node, int64_t round, absl::Time now) {
    Effects effects;
    absl::Status status = state_.ReportDone({job_, node}, SecretOf(node), round, now, &effects);
    EXPECT_TRUE(status.ok()) << status;
    Keep(effects);
    return effects;
  }

  Effects Leave(const std::string& node, absl::Time now, const std::string& reason = "stopped") {
    Effects effects;
    absl::Status status = state_.Leave({job_, node}, SecretOf(node), reason, now, &effects);
    EXPECT_TRUE(status.ok()) << status;
    Keep(effects);
    return effects;
  }

  Effects Advance(absl::Time now) {
    Effects effects;
    state_.Advance(now, &effects);
    Keep(effects);
    return effects;
  }

  void Beat(const std::vector<std::string>& nodes, absl::Time now) {
    for (const std::string& node : nodes) {
      EXPECT_TRUE(state_.Heartbeat({job_, node}, SecretOf(node), now).ok()) << node;
    }
  }

  StatusResponse JobStatus() {
    absl::StatusOr<StatusResponse> status = state_.Status(job_);
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? *status : StatusResponse();
  }

  // Forms round 0 of a job whose min and max are config_'s; every node joins at `now`.
  std::map<std::string, Assignment> Form(const std::vector<Spec>& nodes, absl::Time now) {
    std::map<std::string, Assignment> assigned;
    for (const Spec& spec : nodes) {
      for (auto& [id, a] : Assigned(Join(spec, now))) assigned[id] = a;
    }
    return assigned;
  }

  std::map<std::string, Assignment> Assigned(const Effects& effects) const {
    std::map<std::string, Assignment> out;
    for (const auto& [key, assignment] : effects.assigned) {
      EXPECT_EQ(key.job_id, job_);
      out[key.node_id] = assignment;
    }
    return out;
  }

  static std::vector<std::string> Keys(const std::map<std::string, Assignment>& m) {
    std::vector<std::string> keys;
    for (const auto& [k, v] : m) keys.push_back(k);
    return keys;
  }

  // Node id → every event pushed to it, in order.
  std::map<std::string, std::vector<WatchEvent>> Pushed(const Effects& effects) const {
    std::map<std::string, std::vector<WatchEvent>> out;
    for (const auto& [key, event] : effects.pushed) {
      EXPECT_EQ(key.job_id, job_);
      out[key.node_id].push_back(event);
    }
    return out;
  }

  std::map<std::string, absl::Status> JoinFailed(const Effects& effects) const {
    std::map<std::string, absl::Status> out;
    for (const auto& [key, status] : effects.join_failed) out[key.node_id] = status;
    return out;
  }

  std::string job_ = "job";
  JobConfig config_ = Config(2, 2);
  // Emplaced again by a test that restarts the state (storage_.emplace):
  // state_ then names the new one.
  std::optional<RendezvousState> storage_;
  RendezvousState& state_;
  // The durable changes of every call made through the helpers above.
  std::vector<JournalRecord> journal_;
};

}  // namespace muster::rdzv

#endif  // MUSTER_TESTS_RENDEZVOUS_RULES_STATE_FIXTURE_H_
