#include "agent/site_command.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

extern char** environ;

namespace muster {
namespace {

std::string DescribeWait(int status) {
  if (WIFSIGNALED(status)) return absl::StrCat("signal ", WTERMSIG(status));
  return absl::StrCat("exit code ", WEXITSTATUS(status));
}

}  // namespace

absl::StatusOr<std::string> RunSiteCommand(const std::string& command,
                                           const std::vector<std::string>& extra_env,
                                           absl::Duration limit) {
  // Everything the child needs is made before it starts: posix_spawn runs
  // nothing of ours between its fork and its exec.
  std::vector<std::string> entries = extra_env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const absl::string_view text(*entry);
    const size_t eq = text.find('=');
    bool replaced = false;
    for (const std::string& extra : extra_env) {
      replaced = replaced ||
                 (eq != absl::string_view::npos && absl::StartsWith(extra, text.substr(0, eq + 1)));
    }
    if (!replaced) entries.emplace_back(text);
  }
  std::vector<char*> envp;
  for (std::string& entry : entries) envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::string shell = "/bin/sh", dash_c = "-c", script = command;
  char* argv[] = {shell.data(), dash_c.data(), script.data(), nullptr};

  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);  // the agent blocks its signals
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, shell.c_str(), nullptr, &attr, argv, envp.data());
  posix_spawnattr_destroy(&attr);
  if (spawned != 0) return ErrnoToStatus(spawned, "cannot start /bin/sh");

  const absl::Time deadline = absl::Now() + limit;
  int status = 0;
  while (true) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) return DescribeWait(status);
    if (done < 0 && errno != EINTR) return ErrnoToStatus(errno, "waitpid");
    if (absl::Now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(-pid, SIGKILL);
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return absl::StrCat("killed after ", absl::FormatDuration(limit));
}

}  // namespace muster
