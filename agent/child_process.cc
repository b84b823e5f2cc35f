#include "agent/child_process.h"

#include <fcntl.h>
#include <linux/mempolicy.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/open_files.h"
#include "common/status.h"

namespace muster {
namespace {

void FreeCpuSet(cpu_set_t* set) { CPU_FREE(set); }

// Writes all of `size` bytes; async-signal-safe.
void WriteAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    size -= static_cast<size_t>(n);
  }
}

// What the child needs between clone and exec, prepared by the parent.
struct ExecArgs {
  pid_t parent;
  int out_fd, err_fd, report_fd;
  const char* path;
  char* const* argv;
  char* const* envp;
  bool restore_nofile;  // the agent raised its open-file limit: give the child `nofile`
  rlimit nofile;
  // SpawnOptions::cpus and ::memory_nodes as the system calls take them; null: unchanged.
  const cpu_set_t* cpus;
  size_t cpus_size;
  const unsigned long* nodes;  // a bit per node
  unsigned long max_node;      // bits in `nodes`
  int first_node;
};

// Runs in the child between clone and exec, on its own stack but in the
// parent's memory (CLONE_VM): system calls only, no allocation, no locks.
// Left out of ASan and TSan instrumentation: both take the child for the
// thread that cloned it (same memory, same thread pointer). ASan, seeing
// _exit called on a stack that is not that thread's, warns that it ignores
// __asan_handle_no_return and that false reports may follow; TSan would push
// a frame that never returns onto that thread's shadow stack, one per spawn.
__attribute__((no_sanitize("address", "thread"))) int ExecChild(void* raw) {
  const ExecArgs& args = *static_cast<const ExecArgs*>(raw);
  const int out_fd = args.out_fd;
  const int err_fd = args.err_fd;
  const pid_t parent = args.parent;
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the agent died before the line above
  // Under Yama's ptrace_scope 1 only an ancestor may trace: name the agent,
  // so that the tools it starts to take a hung worker's stacks (its
  // children, the worker's siblings) may attach. Kept across exec; EINVAL
  // without Yama, which is fine.
  prctl(PR_SET_PTRACER, parent, 0, 0, 0);
  // dup2 onto itself keeps FD_CLOEXEC (an agent started with 1 or 2 closed
  // can get its pipe there): clear it by hand then.
  if (out_fd == STDOUT_FILENO) fcntl(out_fd, F_SETFD, 0);
  else if (out_fd >= 0 && dup2(out_fd, STDOUT_FILENO) < 0) _exit(127);
  if (err_fd == STDERR_FILENO) fcntl(err_fd, F_SETFD, 0);
  else if (err_fd >= 0 && dup2(err_fd, STDERR_FILENO) < 0) _exit(127);
  // The agent ignores SIGPIPE and blocks the signals it handles; a worker
  // starts with neither.
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) sigaction(sig, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (args.restore_nofile) setrlimit(RLIMIT_NOFILE, &args.nofile);
  // Best effort: the agent checked the CPUs and nodes against its own, and
  // a worker that runs unbound still runs.
  if (args.cpus != nullptr) sched_setaffinity(0, args.cpus_size, args.cpus);
  if (args.nodes != nullptr &&
      syscall(SYS_set_mempolicy, MPOL_PREFERRED_MANY, args.nodes, args.max_node) != 0) {
    // Kernels before 5.15 prefer one node only.
    const unsigned long first = 1UL << (args.first_node % (8 * sizeof(unsigned long)));
    const unsigned long* word =
        args.first_node < static_cast<int>(8 * sizeof(unsigned long)) ? &first : nullptr;
    if (word != nullptr) syscall(SYS_set_mempolicy, MPOL_PREFERRED, word, 8 * sizeof(first) + 1);
  }
  execve(args.path, args.argv, args.envp);
  const int error = errno;
  WriteAll(args.report_fd, &error, sizeof(error));
  _exit(127);
}

// The child's stack until it execs; the parent is suspended meanwhile
// (CLONE_VFORK), so one stack serves every spawn of this thread.
constexpr size_t kChildStackSize = 64 * 1024;

}  // namespace

absl::Status MakePipe(UniqueFd* read_end, UniqueFd* write_end) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe2");
  read_end->reset(fds[0]);
  write_end->reset(fds[1]);
  return absl::OkStatus();
}

ExitStatus DecodeWaitStatus(int wait_status) {
  ExitStatus status;
  if (WIFEXITED(wait_status)) status.exit_code = WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) status.signal = WTERMSIG(wait_status);
  return status;
}

absl::StatusOr<std::string> ResolveExecutable(const std::string& name,
                                              const std::string& path_env) {
  auto check = [](const std::string& path) -> absl::Status {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, path);
    if (S_ISDIR(st.st_mode))
      return absl::InvalidArgumentError(absl::StrCat(path, " is a directory"));
    if (access(path.c_str(), X_OK) != 0) {
      return absl::PermissionDeniedError(absl::StrCat(
          path, " is not executable (chmod +x it, or run it through python without --no-python)"));
    }
    return absl::OkStatus();
  };
  if (name.empty()) return absl::InvalidArgumentError("empty program name");
  if (name.find('/') != std::string::npos) {
    MUSTER_RETURN_IF_ERROR(check(name));
    return name;
  }
  absl::Status first_error = absl::NotFoundError(
      absl::StrCat(name, ": not found in PATH (give a path like ./", name, ")"));
  for (absl::string_view dir : absl::StrSplit(path_env, ':', absl::SkipEmpty())) {
    std::string candidate = absl::StrCat(dir, "/", name);
    absl::Status status = check(candidate);
    if (status.ok()) return candidate;
    if (absl::IsPermissionDenied(status) && absl::IsNotFound(first_error)) first_error = status;
  }
  return first_error;
}

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Spawn(const SpawnOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("no command to run");
  // Everything the child needs is built before fork: after it, no allocation.
  std::vector<char*> argv;
  for (const std::string& arg : options.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& entry : options.env) envp.push_back(const_cast<char*>(entry.c_str()));
  envp.push_back(nullptr);

  std::unique_ptr<ChildProcess> child(new ChildProcess());
  UniqueFd out_write, err_write, report_read, report_write;
  if (options.capture_output) {
    MUSTER_RETURN_IF_ERROR(MakePipe(&child->stdout_, &out_write));
    MUSTER_RETURN_IF_ERROR(MakePipe(&child->stderr_, &err_write));
  }
  MUSTER_RETURN_IF_ERROR(MakePipe(&report_read, &report_write));

  // clone(CLONE_VM | CLONE_VFORK), as posix_spawn does it: no copy of the
  // agent's page tables, so a spawn costs the same however big the agent is.
  ExecArgs args{getpid(),
                out_write.get(),
                err_write.get(),
                report_write.get(),
                options.path.empty() ? argv[0] : options.path.c_str(),
                argv.data(),
                envp.data(),
                false,
                {},
                nullptr,
                0,
                nullptr,
                0,
                0};
  if (std::optional<rlimit> nofile = OriginalOpenFileLimit()) {
    args.restore_nofile = true;
    args.nofile = *nofile;
  }
  std::unique_ptr<cpu_set_t, decltype(&FreeCpuSet)> cpus(nullptr, FreeCpuSet);
  if (!options.cpus.empty()) {
    const int count = *std::max_element(options.cpus.begin(), options.cpus.end()) + 1;
    cpus.reset(CPU_ALLOC(count));
    if (cpus == nullptr) return absl::ResourceExhaustedError("CPU_ALLOC");
    args.cpus_size = CPU_ALLOC_SIZE(count);
    CPU_ZERO_S(args.cpus_size, cpus.get());
    for (int cpu : options.cpus) CPU_SET_S(cpu, args.cpus_size, cpus.get());
    args.cpus = cpus.get();
  }
  std::vector<unsigned long> nodes;
  if (!options.memory_nodes.empty()) {
    constexpr int kBits = 8 * sizeof(unsigned long);
    const int count = *std::max_element(options.memory_nodes.begin(), options.memory_nodes.end());
    nodes.assign(count / kBits + 1, 0);
    for (int node : options.memory_nodes) nodes[node / kBits] |= 1UL << (node % kBits);
    args.nodes = nodes.data();
    // The kernel reads max_node - 1 bits.
    args.max_node = nodes.size() * kBits + 1;
    args.first_node = options.memory_nodes.front();
  }
  thread_local std::unique_ptr<char[]> stack(new char[kChildStackSize]);
  const pid_t pid =
      clone(ExecChild, stack.get() + kChildStackSize, CLONE_VM | CLONE_VFORK | SIGCHLD, &args);
  if (pid < 0) {
    // EAGAIN: RLIMIT_NPROC, a lack of the agent's, like EMFILE for the pipes.
    if (errno == EAGAIN) {
      return absl::ResourceExhaustedError(
          "clone: too many processes for this user (ulimit -u, RLIMIT_NPROC)");
    }
    return ErrnoToStatus(errno, "clone");
  }
  child->pid_ = pid;
  setpgid(pid, pid);  // also here, so a signal sent right after Spawn reaches the group
  out_write.reset();
  err_write.reset();
  report_write.reset();
  child->MakeNonBlocking();

  // The report pipe closes on a successful exec; otherwise it carries errno.
  int exec_errno = 0;
  ssize_t n;
  do {
    n = read(report_read.get(), &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  if (n == sizeof(exec_errno)) {
    int wait_status;
    while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
    }
    child->exited_ = true;
    return ErrnoToStatus(
        exec_errno,
        absl::StrCat("cannot run ", options.path.empty() ? options.argv[0] : options.path));
  }
  return child;
}

std::unique_ptr<ChildProcess> ChildProcess::Adopt(pid_t pid, UniqueFd out, UniqueFd err) {
  std::unique_ptr<ChildProcess> child(new ChildProcess());
  child->pid_ = pid;
  child->stdout_ = std::move(out);
  child->stderr_ = std::move(err);
  child->MakeNonBlocking();
  return child;
}

void ChildProcess::MakeNonBlocking() {
  for (UniqueFd* fd : {&stdout_, &stderr_}) {
    if (fd->valid()) fcntl(fd->get(), F_SETFL, fcntl(fd->get(), F_GETFL) | O_NONBLOCK);
  }
}

ChildProcess::~ChildProcess() {
  if (pid_ <= 0 || exited_) return;
  SignalGroup(SIGKILL);
  if (abandoned_) return;  // a wait could block for ever
  int wait_status;
  while (waitpid(pid_, &wait_status, 0) < 0 && errno == EINTR) {
  }
}

void ChildProcess::MarkExited(ExitStatus status) {
  exited_ = true;
  exit_status_ = status;
}

void ChildProcess::SignalGroup(int sig) const {
  if (pid_ > 0) kill(-pid_, sig);
}

}  // namespace muster
