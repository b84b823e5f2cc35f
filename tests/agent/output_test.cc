#include "agent/output.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace muster {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

using support::ReadFile;
using support::TempDir;

// A console where every write() arrives as its own message, so a test sees how lines were written.
class PacketConsole {
 public:
  PacketConsole() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds), 0);
    write_end_.reset(fds[0]);
    read_end_.reset(fds[1]);
  }
  int fd() const { return write_end_.get(); }

  // Every write() made so far, in order.
  std::vector<std::string> Writes() {
    std::vector<std::string> writes;
    std::string buffer(256 * 1024, '\0');
    for (;;) {
      ssize_t n = ::recv(read_end_.get(), buffer.data(), buffer.size(), MSG_DONTWAIT);
      if (n <= 0) break;
      writes.emplace_back(buffer.data(), static_cast<size_t>(n));
    }
    return writes;
  }

 private:
  UniqueFd write_end_;
  UniqueFd read_end_;
};

TEST(WorkerOutputTest, JoinsALineSplitAcrossAppends) {
  PacketConsole console;
  WorkerOutput output("[rank 3]: ", console.fd(), UniqueFd());
  output.Append("hel");
  output.Append("lo\nwor");
  EXPECT_THAT(console.Writes(), ElementsAre("[rank 3]: hello\n"));
  output.Append("ld\n");
  EXPECT_THAT(console.Writes(), ElementsAre("[rank 3]: world\n"));
}

TEST(WorkerOutputTest, WritesEachLineOfOneAppendInItsOwnWrite) {
  PacketConsole console;
  WorkerOutput output("[rank 0]: ", console.fd(), UniqueFd());
  output.Append("a\n\nccc\n");
  EXPECT_THAT(console.Writes(), ElementsAre("[rank 0]: a\n", "[rank 0]: \n", "[rank 0]: ccc\n"));
}

TEST(WorkerOutputTest, FinishWritesThePartialLastLineWithANewline) {
  PacketConsole console;
  WorkerOutput output("[rank 1]: ", console.fd(), UniqueFd());
  output.Append("done\nno newline");
  EXPECT_THAT(console.Writes(), ElementsAre("[rank 1]: done\n"));
  output.Finish();
  EXPECT_THAT(console.Writes(), ElementsAre("[rank 1]: no newline\n"));
  output.Finish();
  EXPECT_THAT(console.Writes(), IsEmpty());
}

TEST(WorkerOutputTest, FinishWithNothingPendingWritesNothing) {
  PacketConsole console;
  WorkerOutput output("[rank 1]: ", console.fd(), UniqueFd());
  output.Append("whole\n");
  output.Finish();
  EXPECT_THAT(console.Writes(), ElementsAre("[rank 1]: whole\n"));
}

TEST(WorkerOutputTest, FileGetsRawBytesWithoutPrefix) {
  TempDir dir;
  const std::string path = dir.path() + "/attempt_0/2/stdout.log";
  absl::StatusOr<UniqueFd> file = OpenLogFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  PacketConsole console;
  WorkerOutput output("[rank 2]: ", console.fd(), std::move(*file));
  output.Append("step 1\nstep");
  output.Append(" 2\r\n\ttail");
  output.Finish();
  EXPECT_TRUE(output.file_status().ok());
  EXPECT_EQ(ReadFile(path), "step 1\nstep 2\r\n\ttail");
  EXPECT_THAT(console.Writes(),
              ElementsAre("[rank 2]: step 1\n", "[rank 2]: step 2\r\n", "[rank 2]: \ttail\n"));
}

TEST(WorkerOutputTest, LongLineGoesToConsoleInPrefixedPiecesAndToFileWhole) {
  TempDir dir;
  const std::string console_path = dir.path() + "/console";
  const std::string file_path = dir.path() + "/stderr.log";
  absl::StatusOr<UniqueFd> console = OpenLogFile(console_path);
  absl::StatusOr<UniqueFd> file = OpenLogFile(file_path);
  ASSERT_TRUE(console.ok() && file.ok());
  constexpr size_t kMax = WorkerOutput::kMaxLineBytes;
  const std::string long_line = std::string(kMax, 'a') + std::string(kMax, 'b') + "ccc";
  const std::string exact_line(kMax, 'd');  // Exactly the limit: stays one line.
  {
    WorkerOutput output("[rank 0]: ", console->get(), std::move(*file));
    // Fed in odd-sized slices so the limit falls inside an Append.
    const std::string all = long_line + "\n" + exact_line + "\nend";
    for (size_t i = 0; i < all.size(); i += 1000)
      output.Append(std::string_view(all).substr(i, 1000));
    output.Finish();
    EXPECT_EQ(ReadFile(file_path), all);
  }
  EXPECT_EQ(ReadFile(console_path),
            "[rank 0]: " + std::string(kMax, 'a') + "\n" + "[rank 0]: " + std::string(kMax, 'b') +
                "\n" + "[rank 0]: ccc\n" + "[rank 0]: " + exact_line + "\n" + "[rank 0]: end\n");
}

TEST(WorkerOutputTest, NewlineRightAfterAFullPieceEndsTheLine) {
  TempDir dir;
  absl::StatusOr<UniqueFd> console = OpenLogFile(dir.path() + "/console");
  ASSERT_TRUE(console.ok());
  WorkerOutput output("> ", console->get(), UniqueFd());
  output.Append(std::string(WorkerOutput::kMaxLineBytes, 'x'));
  output.Append("\nnext\n");
  EXPECT_EQ(ReadFile(dir.path() + "/console"),
            "> " + std::string(WorkerOutput::kMaxLineBytes, 'x') + "\n> next\n");
}

TEST(WorkerOutputTest, NoConsoleStillWritesTheFile) {
  TempDir dir;
  const std::string path = dir.path() + "/stdout.log";
  absl::StatusOr<UniqueFd> file = OpenLogFile(path);
  ASSERT_TRUE(file.ok());
  WorkerOutput output("[rank 5]: ", -1, std::move(*file));
  output.Append("only\nto the file");
  output.Finish();
  EXPECT_EQ(ReadFile(path), "only\nto the file");
}

// --duplicate-stdout-filters: matching lines of every worker, prefixed, in one shared file,
// whether or not the console shows them.
TEST(WorkerOutputTest, LinesHoldingAFilterAreCopiedToTheSharedFile) {
  TempDir dir;
  const std::string path = dir.path() + "/filtered_stdout.log";
  absl::StatusOr<UniqueFd> file = OpenLogFile(path);
  ASSERT_TRUE(file.ok());
  LineDuplicator duplicate({"loss", "NCCL WARN"}, std::move(*file));
  PacketConsole console;
  WorkerOutput shown("[rank 0]: ", console.fd(), UniqueFd(), &duplicate);
  WorkerOutput hidden("[rank 1]: ", -1, UniqueFd(), &duplicate);
  shown.Append("step 1 loss 0.5\nstep 1 acc 0.1\n");
  // Case matters; a partial line waits for its end.
  hidden.Append("rank 1 loss 0.6\nLOSS shouted\npartial loss");
  shown.Append("[rank 0] NCCL WARN x\n");
  hidden.Finish();
  EXPECT_EQ(ReadFile(path),
            "[rank 0]: step 1 loss 0.5\n[rank 1]: rank 1 loss 0.6\n[rank 0]: [rank 0] NCCL WARN "
            "x\n[rank 1]: partial loss\n");
  EXPECT_THAT(console.Writes(),
              ElementsAre("[rank 0]: step 1 loss 0.5\n", "[rank 0]: step 1 acc 0.1\n",
                          "[rank 0]: [rank 0] NCCL WARN x\n"));
  EXPECT_TRUE(duplicate.status().ok());
}

// The prefix is not searched: "[rank 0]" must not match a filter "rank".
TEST(WorkerOutputTest, FiltersAreLookedForInTheLineNotItsPrefix) {
  TempDir dir;
  const std::string path = dir.path() + "/filtered_stderr.log";
  absl::StatusOr<UniqueFd> file = OpenLogFile(path);
  ASSERT_TRUE(file.ok());
  LineDuplicator duplicate({"rank"}, std::move(*file));
  WorkerOutput output("[rank 0]: ", -1, UniqueFd(), &duplicate);
  output.Append("no match\n");
  EXPECT_EQ(ReadFile(path), "");
}

TEST(WorkerOutputTest, NoConsoleAndNoFileIsHarmless) {
  WorkerOutput output("[rank 5]: ", -1, UniqueFd());
  output.Append("nowhere\n");
  output.Finish();
  EXPECT_TRUE(output.file_status().ok());
}

TEST(WorkerOutputTest, ClosedPipeConsoleNeitherKillsNorStopsTheFile) {
  // SIGPIPE keeps its default action (terminate): surviving this test shows the agent would.
  ASSERT_EQ(::signal(SIGPIPE, SIG_DFL), SIG_DFL);
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  UniqueFd read_end(fds[0]);
  UniqueFd write_end(fds[1]);
  read_end.reset();

  TempDir dir;
  const std::string path = dir.path() + "/stdout.log";
  absl::StatusOr<UniqueFd> file = OpenLogFile(path);
  ASSERT_TRUE(file.ok());
  WorkerOutput output("[rank 0]: ", write_end.get(), std::move(*file));
  output.Append("first\nsecond\n");
  output.Append("third");
  output.Finish();
  EXPECT_EQ(ReadFile(path), "first\nsecond\nthird");

  sigset_t pending;
  ASSERT_EQ(::sigpending(&pending), 0);
  EXPECT_FALSE(sigismember(&pending, SIGPIPE));
  sigset_t mask;
  ASSERT_EQ(::pthread_sigmask(SIG_SETMASK, nullptr, &mask), 0);
  EXPECT_FALSE(sigismember(&mask, SIGPIPE)) << "the signal mask was not restored";
}

TEST(WorkerOutputTest, FullNonBlockingConsoleDropsLinesButKeepsTheFile) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC | O_NONBLOCK), 0);
  UniqueFd read_end(fds[0]);
  UniqueFd write_end(fds[1]);
  const std::string filler(4096, 'f');
  while (::write(write_end.get(), filler.data(), filler.size()) > 0) {
  }
  ASSERT_EQ(errno, EAGAIN);

  TempDir dir;
  const std::string path = dir.path() + "/stdout.log";
  absl::StatusOr<UniqueFd> file = OpenLogFile(path);
  ASSERT_TRUE(file.ok());
  WorkerOutput output("[rank 0]: ", write_end.get(), std::move(*file));
  output.Append("dropped after a wait\n");
  output.Append("dropped at once\n");

  // Drain: the console works again for the next line.
  std::string buffer(64 * 1024, '\0');
  while (::read(read_end.get(), buffer.data(), buffer.size()) > 0) {
  }
  output.Append("delivered\n");
  ssize_t n = ::read(read_end.get(), buffer.data(), buffer.size());
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buffer.data(), static_cast<size_t>(n)), "[rank 0]: delivered\n");
  EXPECT_EQ(ReadFile(path), "dropped after a wait\ndropped at once\ndelivered\n");
}

TEST(WorkerOutputTest, FileWriteErrorIsReportedAndTheConsoleContinues) {
  PacketConsole console;
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  UniqueFd read_end(fds[0]);
  // A read-only fd stands in for a file that can no longer be written.
  WorkerOutput output("[rank 0]: ", console.fd(), std::move(read_end));
  output.Append("still shown\n");
  EXPECT_EQ(output.file_status().code(), absl::StatusCode::kInternal) << output.file_status();
  EXPECT_THAT(console.Writes(), ElementsAre("[rank 0]: still shown\n"));
  ::close(fds[1]);
}

TEST(MakeDirsTest, CreatesMissingParentsAndAcceptsExisting) {
  TempDir dir;
  const std::string nested = dir.path() + "/run_x/attempt_0/3";
  ASSERT_TRUE(MakeDirs(nested).ok());
  struct stat st;
  ASSERT_EQ(::stat(nested.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(
      st.st_mode & 0777, 0700 &
                             ~[] {
                               mode_t m = ::umask(0);
                               ::umask(m);
                               return m;
                             }())
      << "a job's logs are its owner's alone";
  EXPECT_TRUE(MakeDirs(nested).ok());
  EXPECT_TRUE(MakeDirs(nested + "/").ok());
  EXPECT_TRUE(MakeDirs("/").ok());
}

TEST(MakeDirsTest, FailsWhenAFileIsInTheWay) {
  TempDir dir;
  const std::string file = dir.path() + "/file";
  ASSERT_TRUE(OpenLogFile(file).ok());
  EXPECT_FALSE(MakeDirs(file).ok());
  EXPECT_FALSE(MakeDirs(file + "/below").ok());
  EXPECT_FALSE(OpenLogFile(file + "/below/stdout.log").ok());
  EXPECT_FALSE(MakeDirs("").ok());
}

TEST(OpenLogFileTest, OnlyItsOwnerCanReadANewFile) {
  TempDir dir;
  const std::string path = dir.path() + "/attempt_0/0/stderr.log";
  ASSERT_TRUE(OpenLogFile(path).ok());
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 077, 0u) << "mode " << std::oct << (st.st_mode & 0777);
  ASSERT_EQ(::stat((dir.path() + "/attempt_0").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 077, 0u) << "mode " << std::oct << (st.st_mode & 0777);
}

TEST(OpenLogFileTest, TruncatesAnExistingFile) {
  TempDir dir;
  const std::string path = dir.path() + "/stdout.log";
  {
    absl::StatusOr<UniqueFd> file = OpenLogFile(path);
    ASSERT_TRUE(file.ok());
    ASSERT_EQ(::write(file->get(), "old contents", 12), 12);
  }
  absl::StatusOr<UniqueFd> file = OpenLogFile(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(ReadFile(path), "");
  EXPECT_EQ(::fcntl(file->get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
}

TEST(OpenLogFileTest, MissingDirectoryInAnUnwritablePlaceIsAnError) {
  EXPECT_FALSE(OpenLogFile("/proc/muster_no_such_dir/stdout.log").ok());
}

}  // namespace
}  // namespace muster
