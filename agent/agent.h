// The node agent: joins the rendezvous, starts this node's workers with the
// torchrun environment, supervises them, and restarts them when the job
// moves to a new round. One thread runs everything through an epoll loop:
// child exits and signals arrive on a signalfd, rendezvous results on an
// eventfd, worker output on pipes.
#ifndef MUSTER_AGENT_AGENT_H_
#define MUSTER_AGENT_AGENT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/config.h"
#include "rendezvous/client.h"

namespace muster {

// Exit codes of muster (ARCHITECTURE.md, Agent).
inline constexpr int kExitSuccess = 0;
inline constexpr int kExitWorkersFailed = 1;
inline constexpr int kExitUsage = 2;

struct AgentOptions {
  LaunchConfig config;
  int nproc = 1;            // workers on this node, resolved from --nproc-per-node
  // What each worker execs: the Python interpreter (PYTHON_EXEC, else python3),
  // or with --no-python the script itself; a path, resolved in PATH already.
  std::string program;
  std::string host;         // this node's name, for reports and ranks
  std::string advertised_addr;  // "" = the address the rendezvous server sees
  bool hosts_rendezvous = false;  // the server runs in this process: stay until the job closes
  // Static backend: ranks and master come from the command line, not the round.
  bool static_ranks = false;
};

// The signals an agent handles. Block them in every thread before any
// thread starts (gRPC's included): the agent reads them from a signalfd.
void BlockAgentSignals();

class Agent {
 public:
  // `client` talks to the rendezvous server of the job.
  Agent(AgentOptions options, std::unique_ptr<rdzv::RendezvousClient> client);
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
