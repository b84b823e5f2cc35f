#include "agent/worker_group.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "agent/error_file.h"
#include "agent/stack_capture.h"
#include "agent/template.h"
#include "agent/worker_env.h"

namespace muster {
namespace {

constexpr size_t kReadChunk = 64 * 1024;
// Per tool and worker: a few hundred frames.
constexpr size_t kMaxStackBytes = 256 * 1024;

// The flight recorder dump PyTorch's NCCL watchdog writes for `rank` (to
// TORCH_NCCL_DEBUG_INFO_TEMP_FILE + rank, /tmp/nccl_trace_rank_ by default)
// when it is on, if one was written since `since`.
std::string NcclDump(const std::vector<std::string>& env, int rank, absl::Time since) {
  const std::string dump = FindEnv(env, "TORCH_NCCL_DUMP_ON_TIMEOUT").value_or("");
  const std::string buffer = FindEnv(env, "TORCH_NCCL_TRACE_BUFFER_SIZE").value_or("0");
  if (dump != "1" && dump != "true" && buffer == "0") return "";
  const std::string path = absl::StrCat(
      FindEnv(env, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE").value_or("/tmp/nccl_trace_rank_"), rank);
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || absl::TimeFromTimespec(st.st_mtim) < since) return "";
  return path;
}

// What the kernel says `pid` is doing: its state, and the kernel function it
// sleeps in ("state D (disk sleep), in nfs_wait_bit_killable").
std::string KernelWait(pid_t pid) {
  const std::string dir = absl::StrCat("/proc/", pid);
  const std::string stat = ReadProcFile(dir + "/status");
  if (stat.empty()) return "its state cannot be read";
  std::string state = "state unknown";
  for (absl::string_view line : absl::StrSplit(stat, '\n')) {
    if (absl::ConsumePrefix(&line, "State:"))
      state = absl::StrCat("state ", absl::StripAsciiWhitespace(line));
  }
  const std::string wchan = ReadProcFile(dir + "/wchan");
  if (!wchan.empty() && wchan != "0") {
    return absl::StrCat(state, ", in ", wchan);
  }
  return state;
}

}  // namespace

WorkerGroup::WorkerGroup(WorkerGroupOptions options, ProcessRunner& runner, EventLoop& loop,
                         Clock& clock)
    : options_(std::move(options)), runner_(runner), loop_(loop), clock_(clock),
      logger_(Logger("agent")) {}

WorkerGroup::~WorkerGroup() {
  for (Worker& worker : workers_) {
    for (UniqueFd* pipe : {&worker.out_fd, &worker.err_fd}) {
      if (pipe->valid()) loop_.Remove(pipe->get());
    }
  }
  workers_.clear();  // each Process kills and reaps its child if still running
}

void WorkerGroup::OpenDuplicators(const std::string& attempt_dir) {
  const LaunchConfig& config = *options_.config;
  // torchrun's attempt_<n>/filtered_std{out,err}.log, shared by the attempt's workers.
  auto duplicator = [&](const std::vector<std::string>& filters, const char* file,
                        std::optional<LineDuplicator>& slot) {
    slot.reset();
    if (filters.empty()) return;
    absl::StatusOr<UniqueFd> opened = OpenLogFile(absl::StrCat(attempt_dir, "/", file));
    if (!opened.ok()) {
      logger_->warn("{}; lines that match the filters are not copied", opened.status().message());
      return;
    }
    slot.emplace(filters, *std::move(opened));
  };
  duplicator(config.duplicate_stdout_filters, "filtered_stdout.log", duplicate_out_);
  duplicator(config.duplicate_stderr_filters, "filtered_stderr.log", duplicate_err_);
}

SpawnOptions WorkerGroup::SpawnFor(const NodePlacement& placement, const Worker& worker,
                                   const Instead* instead) const {
  const LaunchConfig& config = *options_.config;
  WorkerIdentity identity;
  identity.local_rank = worker.local_rank;
  identity.local_world_size = options_.nproc;
  identity.run_id = config.rdzv_id;
  identity.role = config.role;
  identity.error_file = worker.error_file;
  identity.progress_file = worker.progress_file;
  identity.signals_to_handle = config.signals_to_handle_text;
  identity.virtual_local_rank = config.virtual_local_rank;
  SpawnOptions spawn;
  spawn.path = instead != nullptr ? instead->argv.at(0) : options_.program;
  spawn.argv = instead != nullptr ? instead->argv
                                  : WorkerCommand(config, options_.program, worker.local_rank);
  spawn.env = WorkerEnvironment(options_.base_env, placement, identity);
  spawn.python_script = instead == nullptr && !config.no_python;
  if (static_cast<size_t>(worker.local_rank) < options_.numa.size()) {
    spawn.cpus = options_.numa[worker.local_rank].cpus;
    spawn.memory_nodes = options_.numa[worker.local_rank].memory_nodes;
  }
  return spawn;
}

std::optional<WorkerFailure> WorkerGroup::StartWorker(const NodePlacement& placement,
                                                      int local_rank,
                                                      const std::string& attempt_dir,
                                                      const Instead* instead) {
  const LaunchConfig& config = *options_.config;
  Worker& worker = workers_.emplace_back();
  worker.local_rank = local_rank;
  worker.rank = placement.rank_base + local_rank;
  const std::string rank_dir = absl::StrCat(attempt_dir, "/", local_rank);
  worker.error_file = rank_dir + "/error.json";
  if (instead == nullptr) {
    worker.progress_file =
        options_.progress_dir.empty()
            ? rank_dir + "/progress"
            : absl::StrCat(options_.progress_dir, "/attempt_", attempt_, ".", local_rank);
  }
  absl::Status dir = MakeDirs(rank_dir);
  if (!dir.ok()) logger_->warn("cannot create {}: {}", rank_dir, dir.message());

  const StdRedirect redirect = config.redirects.For(local_rank);
  const StdRedirect tee = config.tee.For(local_rank);
  const bool shown = !config.local_ranks_filter || config.local_ranks_filter->contains(local_rank);
  auto open_log = [&](bool wanted, const char* file) {
    if (!wanted) return UniqueFd();
    absl::StatusOr<UniqueFd> opened = OpenLogFile(absl::StrCat(rank_dir, "/", file));
    if (opened.ok()) return *std::move(opened);
    logger_->warn("{}", opened.status().message());
    return UniqueFd();
  };
  UniqueFd out_log = open_log(redirect.out || tee.out, "stdout.log");
  UniqueFd err_log = open_log(redirect.err || tee.err, "stderr.log");

  absl::StatusOr<std::unique_ptr<Process>> child =
      runner_.Spawn(SpawnFor(placement, worker, instead));
  if (!child.ok()) {
    // Nothing to supervise for this rank: it counts as a failed worker.
    Worker failed;
    failed.local_rank = local_rank;
    failed.rank = worker.rank;
    workers_.pop_back();
    WorkerFailure failure =
        Describe(failed, ExitStatus{127, 0}, std::string(child.status().message()));
    failure.agent_out_of_resources = absl::IsResourceExhausted(child.status());
    return failure;
  }
  worker.process = *std::move(child);
  worker.started = clock_.Now();
  // Made once the pid is known: the prefix may name it.
  const std::string prefix = LinePrefix(worker);
  auto make_output = [&](bool redirected, bool teed, int console, UniqueFd log,
                         std::optional<LineDuplicator>& duplicate) {
    const bool to_console = shown && (teed || !redirected);
    return WorkerOutput(prefix, to_console ? console : -1, std::move(log),
                        duplicate ? &*duplicate : nullptr);
  };
  worker.out.emplace(
      make_output(redirect.out, tee.out, options_.console_out, std::move(out_log), duplicate_out_));
  worker.err.emplace(
      make_output(redirect.err, tee.err, options_.console_err, std::move(err_log), duplicate_err_));
  worker.out_fd = worker.process->TakeStdout();
  worker.err_fd = worker.process->TakeStderr();
  Worker* self = &worker;
  for (bool is_stderr : {false, true}) {
    const UniqueFd& fd = is_stderr ? worker.err_fd : worker.out_fd;
    if (!fd.valid()) continue;
    absl::Status watched =
        loop_.Add(fd.get(), [this, self, is_stderr] { OnReadable(*self, is_stderr); });
    if (!watched.ok()) logger_->warn("{}", watched.message());
  }
  return std::nullopt;
}

WorkerGroup::Started WorkerGroup::Start(const NodePlacement& placement, int attempt,
                                        const Instead* instead) {
  const std::string attempt_dir = instead != nullptr
                                      ? absl::StrCat(options_.run_dir, "/", instead->dir)
                                      : absl::StrCat(options_.run_dir, "/attempt_", attempt);
  for (Worker& worker : workers_) DrainAndClose(worker);
  workers_.clear();
  attempt_ = attempt;
  // Reserved: the output readers hold pointers to the workers.
  workers_.reserve(options_.nproc);
  Started started;
  OpenDuplicators(attempt_dir);
  for (int local_rank = 0; local_rank < options_.nproc; ++local_rank) {
    started.failure = StartWorker(placement, local_rank, attempt_dir, instead);
    if (started.failure) break;
    ++started.count;
  }
  return started;
}

std::string WorkerGroup::LinePrefix(const Worker& worker) const {
  const std::string& tmpl = options_.config->log_line_prefix_template;
  if (tmpl.empty()) return absl::StrCat("[rank ", worker.rank, "]: ");
  return SubstituteTemplate(tmpl, {{"role_name", options_.config->role},
                                   {"rank", absl::StrCat(worker.rank)},
                                   {"local_rank", absl::StrCat(worker.local_rank)},
                                   {"pid", absl::StrCat(worker.process->pid())},
                                   {"hostname", options_.host}});
}

WorkerGroup::Worker* WorkerGroup::Find(pid_t pid) {
  for (Worker& worker : workers_) {
    // (No process: one given up on, see AbandonRunning.)
    if (worker.process && worker.process->pid() == pid && !worker.process->exited()) {
      return &worker;
    }
  }
  return nullptr;
}

WorkerGroup::Worker* WorkerGroup::FindByGroup(pid_t pid) {
  if (Worker* worker = Find(pid)) return worker;
  const pid_t group = getpgid(pid);
  return group > 0 ? Find(group) : nullptr;
}

std::string WorkerGroup::RankDir(const Worker& worker) const {
  const size_t slash = worker.error_file.rfind('/');
  return slash == std::string::npos ? options_.run_dir : worker.error_file.substr(0, slash);
}

WorkerFailure WorkerGroup::Exited(Worker& worker, ExitStatus status) {
  worker.process->MarkExited(status);
  DrainAndClose(worker);
  return Describe(worker, status, "");
}

void WorkerGroup::SignalAll(int sig) {
  for (Worker& worker : workers_) {
    if (worker.process && !worker.process->exited()) worker.process->SignalGroup(sig);
  }
}

std::vector<WorkerGroup::Worker*> WorkerGroup::Running() {
  std::vector<Worker*> running;
  for (Worker& worker : workers_) {
    if (worker.process && !worker.process->exited()) running.push_back(&worker);
  }
  return running;
}

void WorkerGroup::CaptureStacks(const std::vector<Worker*>& workers, absl::Duration limit) {
  const std::string script = options_.run_dir + "/pystacks.py";
  if (!wrote_script_) {
    absl::Status written = WritePythonStacksScript(script);
    if (!written.ok()) logger_->warn("{}", written.message());
    wrote_script_ = true;
  }
  std::vector<std::pair<pid_t, std::vector<StackTool>>> targets;
  for (const Worker* worker : workers) {
    const pid_t pid = worker->process->pid();
    targets.emplace_back(pid, StackToolsFor(pid, script));
  }
  std::map<pid_t, std::string> stacks = muster::CaptureStacks(targets, limit, kMaxStackBytes);
  for (Worker* worker : workers) {
    const pid_t pid = worker->process->pid();
    worker->stack = stacks[pid];
    worker->stack_file = RankDir(*worker) + "/stack.txt";
    const std::string text =
        absl::StrCat("stacks of rank ", worker->rank, " (local rank ", worker->local_rank, ", pid ",
                     pid, ") at ", absl::FormatTime(clock_.Now()), "\n", worker->stack);
    absl::StatusOr<UniqueFd> file = OpenLogFile(worker->stack_file);
    if (!file.ok() || write(file->get(), text.data(), text.size()) < 0) {
      logger_->warn("cannot write {}: {}", worker->stack_file,
                    file.ok() ? std::strerror(errno) : file.status().message());
      worker->stack_file.clear();
    }
  }
}

int WorkerGroup::AbandonRunning() {
  int count = 0;
  for (Worker& worker : workers_) {
    if (worker.process == nullptr || worker.process->exited()) continue;
    const pid_t pid = worker.process->pid();
    logger_->error("rank {} (local rank {}, pid {}) cannot be killed: {}; muster leaves it behind",
                   worker.rank, worker.local_rank, pid, KernelWait(pid));
    worker.process->Abandon();
    DrainAndClose(worker);
    abandoned_.push_back(std::move(worker.process));
    ++count;
  }
  return count;
}

bool WorkerGroup::ReapedAbandoned(pid_t pid) {
  for (auto it = abandoned_.begin(); it != abandoned_.end(); ++it) {
    if ((*it)->pid() != pid) continue;
    (*it)->MarkExited(ExitStatus{});
    abandoned_.erase(it);
    return true;
  }
  return false;
}

void WorkerGroup::OnReadable(Worker& worker, bool is_stderr) {
  UniqueFd& pipe = is_stderr ? worker.err_fd : worker.out_fd;
  std::optional<WorkerOutput>& output = is_stderr ? worker.err : worker.out;
  char buffer[kReadChunk];
  for (;;) {
    ssize_t n = read(pipe.get(), buffer, sizeof(buffer));
    if (n > 0) {
      output->Append(std::string_view(buffer, static_cast<size_t>(n)));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    // EOF or a hard error: this stream is over.
    output->Finish();
    loop_.Remove(pipe.get());
    pipe.reset();
    return;
  }
}

void WorkerGroup::DrainAndClose(Worker& worker) {
  for (auto [pipe, output] :
       {std::pair{&worker.out_fd, &worker.out}, std::pair{&worker.err_fd, &worker.err}}) {
    if (!pipe->valid()) continue;
    char buffer[kReadChunk];
    ssize_t n;
    while ((n = read(pipe->get(), buffer, sizeof(buffer))) > 0 || (n < 0 && errno == EINTR)) {
      if (n > 0) (*output)->Append(std::string_view(buffer, static_cast<size_t>(n)));
    }
    (*output)->Finish();
    loop_.Remove(pipe->get());
    pipe->reset();
  }
}

WorkerFailure WorkerGroup::Describe(const Worker& worker, ExitStatus status,
                                    const std::string& message) {
  WorkerFailure failure;
  failure.rank = worker.rank;
  failure.local_rank = worker.local_rank;
  failure.host = options_.host;
  failure.pid = worker.process ? worker.process->pid() : 0;
  failure.exit_code = status.exit_code;
  failure.signal = status.signal;
  failure.time = clock_.Now();
  failure.error_file = worker.error_file;
  failure.killed_for = worker.killed_for;
  failure.stack = worker.stack;
  failure.stack_file = worker.stack_file;
  if (status.success()) return failure;
  failure.nccl_dump = NcclDump(options_.base_env, worker.rank, worker.started);
  if (!message.empty()) {
    failure.error = WorkerError{message, "", std::nullopt};
  } else if (!worker.error_file.empty()) {
    absl::StatusOr<WorkerError> error = ReadErrorFile(worker.error_file);
    if (error.ok()) {
      failure.error = *std::move(error);
    } else if (!absl::IsNotFound(error.status())) {
      logger_->warn("rank {}: unreadable error file: {}", worker.rank, error.status().message());
    }
  }
  return failure;
}

}  // namespace muster
