// The node agent: joins the rendezvous, starts this node's workers with the
// torchrun environment, supervises them, and restarts them when the job
// moves to a new round. The rules are ElasticState's (elastic_state.h);
// this is the edge that carries its actions out: one thread runs an
// EventLoop (child exits and signals on a signalfd, rendezvous results
// posted from gRPC's threads, worker output on pipes), the workers are a
// WorkerGroup started through a ProcessRunner, the time is a Clock.
#ifndef MUSTER_AGENT_AGENT_H_
#define MUSTER_AGENT_AGENT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/config.h"
#include "agent/exit_codes.h"
#include "agent/metrics.h"
#include "agent/process_runner.h"
#include "common/clock.h"
#include "common/unique_handle.h"
#include "rendezvous/client/client.h"

namespace muster {

struct AgentOptions {
  LaunchConfig config;
  int nproc = 1;  // workers on this node, resolved from --nproc-per-node
  // What each worker execs: the Python interpreter (PYTHON_EXEC, else python3),
  // or with --no-python the script itself; a path, resolved in PATH already.
  std::string program;
  std::string host;               // this node's name, for reports and ranks
  std::string advertised_addr;    // "" = the address the rendezvous server sees
  bool hosts_rendezvous = false;  // the server runs in this process: stay until the job closes
  // A member of the job's own etcd cluster may run in this process (ha=1):
  // having finished, stay until the job closes (ElasticOptions).
  bool stays_until_closed = false;
  // Static backend: ranks and master come from the command line, not the round.
  bool static_ranks = false;
  // KEY=VALUE: the environment each worker's starts from (the agent's own, in muster).
  std::vector<std::string> base_env;
  // Where the events go besides the console (config.rdzv_conf.event_log,
  // opened for appending by the launcher); invalid: nowhere.
  UniqueFd event_log;
  // Told of rounds and exits, for Prometheus (config.rdzv_conf.metrics_port,
  // served by the launcher); null: none.
  std::shared_ptr<AgentMetrics> metrics;
  // muster-allreduce's path, for config.preflight.
  std::string allreduce;
};

// The signals an agent with `config` handles. Block them in every thread
// before any thread starts (gRPC's included): the agent reads them from a
// signalfd.
void BlockAgentSignals(const LaunchConfig& config);

// For a wait before the agent runs, with nothing of its own to stop yet: one
// of those signals pending ends this process, as it would have before they
// were blocked (each ends a process by default).
void TakePendingAgentSignal(const LaunchConfig& config);

class Agent {
 public:
  // `client` talks to the rendezvous server of the job. `runner` (null: the
  // real one) and `clock` outlive the agent.
  Agent(AgentOptions options, std::unique_ptr<rdzv::RendezvousClient> client,
        ProcessRunner* runner = nullptr, Clock& clock = Clock::Real());
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Runs the job to its end and returns muster's exit code: 0 every worker
  // succeeded; 1 workers failed and restarts ran out (after printing the
  // failure report); 128+N stopped by signal N. An error status is a setup
  // failure of the agent itself.
  absl::StatusOr<int> Run();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace muster

#endif  // MUSTER_AGENT_AGENT_H_
