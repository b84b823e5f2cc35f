// The worker group on a fake ProcessRunner: what each worker is started
// with, what a failed start means, who gets a signal, how output and error
// files are carried. No process is started.
#include "agent/worker_group.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/support/temp_dir.h"

namespace muster {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

class FakeRunner;

class FakeProcess final : public Process {
 public:
  FakeProcess(pid_t pid, FakeRunner* runner, UniqueFd out, UniqueFd err)
      : pid_(pid), runner_(runner), out_(std::move(out)), err_(std::move(err)) {}
  ~FakeProcess() override;
  pid_t pid() const override { return pid_; }
  bool exited() const override { return exited_; }
  void MarkExited(ExitStatus) override { exited_ = true; }
  void SignalGroup(int sig) const override;
  void Abandon() override;
  UniqueFd TakeStdout() override { return std::move(out_); }
  UniqueFd TakeStderr() override { return std::move(err_); }

 private:
  pid_t pid_;
  FakeRunner* runner_;
  bool exited_ = false;
  UniqueFd out_, err_;
};

// Records every spawn and signal; a spawn's stdout and stderr are pipes
// whose write ends the test holds.
class FakeRunner final : public ProcessRunner {
 public:
  absl::StatusOr<std::unique_ptr<Process>> Spawn(const SpawnOptions& options) override {
    spawned.push_back(options);
    if (fail_spawn_at && static_cast<int>(spawned.size()) - 1 == *fail_spawn_at) {
      return absl::PermissionDeniedError("cannot run ./train: Permission denied");
    }
    const pid_t pid = next_pid++;
    UniqueFd out_read, err_read;
    for (auto [read_end, name] : {std::pair{&out_read, "out"}, std::pair{&err_read, "err"}}) {
      int fds[2];
      if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return absl::InternalError("pipe2");
      read_end->reset(fds[0]);
      writers[{pid, name}].reset(fds[1]);
    }
    return std::unique_ptr<Process>(
        new FakeProcess(pid, this, std::move(out_read), std::move(err_read)));
  }
  std::optional<ChildExit> NextExit() override { return std::nullopt; }
  void Reap(pid_t) override {}

  // What worker `pid` writes to its stdout ("out") or stderr ("err"), then closes.
  void Write(pid_t pid, const char* stream, const std::string& text) {
    UniqueFd& fd = writers.at({pid, stream});
    ASSERT_EQ(write(fd.get(), text.data(), text.size()), static_cast<ssize_t>(text.size()));
    fd.reset();
  }

  std::vector<SpawnOptions> spawned;
  std::optional<int> fail_spawn_at;
  std::vector<std::pair<pid_t, int>> signals;
  std::vector<pid_t> destroyed_running;
  std::vector<pid_t> abandoned;
  std::map<std::pair<pid_t, std::string>, UniqueFd> writers;
  pid_t next_pid = 100;
};

FakeProcess::~FakeProcess() {
  if (!exited_) runner_->destroyed_running.push_back(pid_);
}

void FakeProcess::SignalGroup(int sig) const { runner_->signals.emplace_back(pid_, sig); }
void FakeProcess::Abandon() { runner_->abandoned.push_back(pid_); }

std::string EnvValue(const SpawnOptions& spawn, const std::string& key) {
  for (const std::string& entry : spawn.env) {
    if (entry.rfind(key + "=", 0) == 0) return entry.substr(key.size() + 1);
  }
  return "<unset>";
}

// Everything readable from a non-blocking fd now.
std::string ReadNow(int fd) {
  std::string out;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof buffer)) > 0) out.append(buffer, static_cast<size_t>(n));
  return out;
}

using support::ReadFile;

class WorkerGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    run_dir_ = dir_.path();
    int fds[2];
    ASSERT_EQ(pipe2(fds, O_CLOEXEC | O_NONBLOCK), 0);
    console_read_.reset(fds[0]);
    console_write_.reset(fds[1]);
    absl::StatusOr<std::unique_ptr<EventLoop>> loop = EventLoop::Create(clock_, {});
    ASSERT_TRUE(loop.ok()) << loop.status();
    loop_ = *std::move(loop);
    config_.script = "train.py";
    config_.script_args = {"--lr", "0.1"};
    config_.rdzv_id = "job7";
  }
  void TearDown() override { group_.reset(); }

  WorkerGroup& Group(int nproc) {
    WorkerGroupOptions options;
    options.config = &config_;
    options.nproc = nproc;
    options.program = "/usr/bin/python3";
    options.host = "node-a";
    options.run_dir = run_dir_;
    options.base_env = base_env_;
    options.console_out = console_write_.get();
    options.console_err = console_write_.get();
    group_ = std::make_unique<WorkerGroup>(std::move(options), runner_, *loop_, clock_);
    return *group_;
  }

  static NodePlacement Placement(int rank_base, int world_size) {
    NodePlacement placement;
    placement.group_rank = 1;
    placement.group_world_size = 2;
    placement.rank_base = rank_base;
    placement.world_size = world_size;
    placement.master_addr = "node-m";
    placement.master_port = 29500;
    return placement;
  }

  FakeClock clock_;
  FakeRunner runner_;
  std::vector<std::string> base_env_ = {"PATH=/opt/bin", "KEEP=me", "RANK=stale"};
  LaunchConfig config_;
  support::TempDir dir_{"worker_group_test"};
  std::string run_dir_;
  UniqueFd console_read_, console_write_;
  std::unique_ptr<EventLoop> loop_;
  std::unique_ptr<WorkerGroup> group_;
};

TEST_F(WorkerGroupTest, EveryLocalRankStartsWithItsRanksOnTopOfTheBaseEnvironment) {
  WorkerGroup::Started started = Group(3).Start(Placement(4, 6), 0);
  EXPECT_EQ(started.count, 3);
  EXPECT_FALSE(started.failure);
  ASSERT_EQ(runner_.spawned.size(), 3u);
  for (int local_rank = 0; local_rank < 3; ++local_rank) {
    const SpawnOptions& spawn = runner_.spawned[local_rank];
    EXPECT_EQ(spawn.path, "/usr/bin/python3");
    EXPECT_THAT(spawn.argv, ElementsAre("/usr/bin/python3", "-u", "train.py", "--lr", "0.1"));
    EXPECT_EQ(EnvValue(spawn, "RANK"), absl::StrCat(4 + local_rank));
    EXPECT_EQ(EnvValue(spawn, "LOCAL_RANK"), absl::StrCat(local_rank));
    EXPECT_EQ(EnvValue(spawn, "WORLD_SIZE"), "6");
    EXPECT_EQ(EnvValue(spawn, "MASTER_ADDR"), "node-m");
    EXPECT_EQ(EnvValue(spawn, "KEEP"), "me");
    EXPECT_EQ(EnvValue(spawn, "PATH"), "/opt/bin");
    EXPECT_EQ(EnvValue(spawn, "TORCHELASTIC_ERROR_FILE"),
              absl::StrCat(run_dir_, "/attempt_0/", local_rank, "/error.json"));
    EXPECT_TRUE(std::filesystem::is_directory(absl::StrCat(run_dir_, "/attempt_0/", local_rank)));
  }
}

TEST_F(WorkerGroupTest, AWorkerThatCannotStartIsAFailureAndTheRanksAfterItAreNotTried) {
  runner_.fail_spawn_at = 1;
  WorkerGroup::Started started = Group(3).Start(Placement(4, 6), 0);
  EXPECT_EQ(started.count, 1);
  ASSERT_TRUE(started.failure);
  EXPECT_EQ(started.failure->rank, 5);
  EXPECT_EQ(started.failure->local_rank, 1);
  EXPECT_EQ(started.failure->exit_code, 127);
  EXPECT_EQ(started.failure->host, "node-a");
  EXPECT_EQ(started.failure->time, clock_.Now());
  ASSERT_TRUE(started.failure->error);
  EXPECT_EQ(started.failure->error->message, "cannot run ./train: Permission denied");
  EXPECT_EQ(runner_.spawned.size(), 2u);
  EXPECT_EQ(group_->workers().size(), 1u);
}

TEST_F(WorkerGroupTest, SignalsReachOnlyTheWorkersStillRunning) {
  WorkerGroup& group = Group(3);
  group.Start(Placement(0, 3), 0);
  ASSERT_NE(group.Find(101), nullptr);
  group.Exited(*group.Find(101), ExitStatus{0, 0});
  EXPECT_EQ(group.Find(101), nullptr) << "an exited worker is nobody's pid any more";
  EXPECT_EQ(group.Find(999), nullptr);
  group.SignalAll(SIGTERM);
  EXPECT_THAT(runner_.signals, ElementsAre(std::pair{100, SIGTERM}, std::pair{102, SIGTERM}));
}

TEST_F(WorkerGroupTest, AWorkerThatCannotDieIsLeftBehindAndTheNextAttemptStarts) {
  WorkerGroup& group = Group(2);
  group.Start(Placement(0, 2), 0);
  group.Exited(*group.Find(100), ExitStatus{0, SIGKILL});
  // 101 got SIGKILL and was never reaped (D state): the agent gives up on it.
  EXPECT_EQ(group.AbandonRunning(), 1);
  EXPECT_THAT(runner_.abandoned, ElementsAre(101));
  EXPECT_EQ(group.Find(101), nullptr) << "no longer a worker of the group";
  EXPECT_EQ(group.AbandonRunning(), 0) << "given up on once";
  // The next attempt starts though 101 never exited.
  WorkerGroup::Started started = group.Start(Placement(0, 2), 1);
  EXPECT_EQ(started.count, 2);
  EXPECT_THAT(runner_.destroyed_running, IsEmpty()) << "the abandoned one is kept, not dropped";
  // Should it exit after all, it is recognised and let go.
  EXPECT_TRUE(group.ReapedAbandoned(101));
  EXPECT_FALSE(group.ReapedAbandoned(101));
  EXPECT_FALSE(group.ReapedAbandoned(102)) << "a running worker is not an abandoned one";
}

TEST_F(WorkerGroupTest, AFailedWorkersNcclFlightRecorderDumpIsPointedTo) {
  const std::string prefix = run_dir_ + "/nccl_trace_";
  base_env_ = {"TORCH_NCCL_DUMP_ON_TIMEOUT=1", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE=" + prefix};
  WorkerGroup& group = Group(2);
  group.Start(Placement(4, 6), 0);
  std::ofstream(prefix + "4") << "dump";  // rank 4's, written while it ran
  EXPECT_EQ(group.Exited(*group.Find(100), ExitStatus{0, SIGABRT}).nccl_dump, prefix + "4");
  EXPECT_EQ(group.Exited(*group.Find(101), ExitStatus{0, SIGABRT}).nccl_dump, "")
      << "rank 5 wrote none";
}

TEST_F(WorkerGroupTest, AFailedWorkerIsDescribedWithWhatItsErrorFileSays) {
  WorkerGroup& group = Group(1);
  group.Start(Placement(2, 3), 0);
  {
    std::ofstream(EnvValue(runner_.spawned[0], "TORCHELASTIC_ERROR_FILE"))
        << R"({"message": {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": "tb", )"
           R"("timestamp": "1796229363"}}})";
  }
  clock_.Advance(absl::Seconds(3));
  WorkerFailure failure = group.Exited(*group.Find(100), ExitStatus{1, 0});
  EXPECT_EQ(failure.rank, 2);
  EXPECT_EQ(failure.pid, 100);
  EXPECT_EQ(failure.exit_code, 1);
  EXPECT_EQ(failure.time, clock_.Now());
  ASSERT_TRUE(failure.error);
  EXPECT_EQ(failure.error->message, "RuntimeError: boom");
}

TEST_F(WorkerGroupTest, OutputReachesTheConsoleWithTheRankPrefixWhenTheWorkerExits) {
  WorkerGroup& group = Group(2);
  group.Start(Placement(0, 2), 0);
  runner_.Write(100, "out", "hello\nno newline");
  runner_.Write(101, "err", "warn\n");
  group.Exited(*group.Find(100), ExitStatus{0, 0});
  group.Exited(*group.Find(101), ExitStatus{0, 0});
  EXPECT_EQ(ReadNow(console_read_.get()),
            "[rank 0]: hello\n[rank 0]: no newline\n[rank 1]: warn\n");
}

TEST_F(WorkerGroupTest, RedirectedOutputGoesToTheRankLogOnlyAndTeedToBoth) {
  config_.redirects.per_rank[0] = StdRedirect{true, false};
  config_.tee.per_rank[1] = StdRedirect{true, false};
  WorkerGroup& group = Group(2);
  group.Start(Placement(0, 2), 3);
  runner_.Write(100, "out", "to file\n");
  runner_.Write(101, "out", "to both\n");
  group.Exited(*group.Find(100), ExitStatus{0, 0});
  group.Exited(*group.Find(101), ExitStatus{0, 0});
  EXPECT_EQ(ReadNow(console_read_.get()), "[rank 1]: to both\n");
  EXPECT_EQ(ReadFile(run_dir_ + "/attempt_3/0/stdout.log"), "to file\n");
  EXPECT_EQ(ReadFile(run_dir_ + "/attempt_3/1/stdout.log"), "to both\n");
  EXPECT_FALSE(std::filesystem::exists(run_dir_ + "/attempt_3/0/stderr.log"));
}

TEST_F(WorkerGroupTest, FilteredRanksAreNotShownOnTheConsole) {
  config_.local_ranks_filter = std::set<int>{1};
  WorkerGroup& group = Group(2);
  group.Start(Placement(0, 2), 0);
  runner_.Write(100, "out", "hidden\n");
  runner_.Write(101, "out", "shown\n");
  group.Exited(*group.Find(100), ExitStatus{0, 0});
  group.Exited(*group.Find(101), ExitStatus{0, 0});
  EXPECT_EQ(ReadNow(console_read_.get()), "[rank 1]: shown\n");
}

TEST_F(WorkerGroupTest, ANewAttemptReplacesTheOldWorkersAndDroppingTheGroupKillsTheRunningOnes) {
  WorkerGroup& group = Group(2);
  group.Start(Placement(0, 2), 0);
  group.Exited(*group.Find(100), ExitStatus{0, SIGTERM});
  group.Exited(*group.Find(101), ExitStatus{0, SIGTERM});
  group.Start(Placement(2, 4), 1);
  EXPECT_EQ(EnvValue(runner_.spawned[2], "RANK"), "2");
  EXPECT_EQ(EnvValue(runner_.spawned[2], "TORCHELASTIC_ERROR_FILE"),
            run_dir_ + "/attempt_1/0/error.json");
  EXPECT_THAT(runner_.destroyed_running, IsEmpty());
  group_.reset();
  EXPECT_THAT(runner_.destroyed_running, UnorderedElementsAre(102, 103));
}

}  // namespace
}  // namespace muster
