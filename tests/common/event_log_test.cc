// The event log's writer: lines in order, none lost on a clean stop, a full
// disk told once, and a reader that stalls costs dropped lines, counted,
// never a blocked caller.
#include "common/event_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muster {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::SizeIs;

// What the writer warned, from its thread.
struct Warnings {
  std::function<void(const std::string&)> Sink() {
    return [this](const std::string& line) {
      absl::MutexLock lock(&mu);
      lines.push_back(line);
    };
  }
  std::vector<std::string> Get() {
    absl::MutexLock lock(&mu);
    return lines;
  }
  absl::Mutex mu;
  std::vector<std::string> lines;
};

std::string ReadAll(int fd) {
  std::string out;
  char buffer[65536];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) out.append(buffer, n);
  return out;
}

TEST(EventLogWriterTest, EveryLineIsWrittenInOrderBeforeTheWriterIsGone) {
  char path[] = "/tmp/event-log-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  Warnings warnings;
  {
    EventLogWriter writer(UniqueFd(dup(fd)), "test", warnings.Sink());
    for (int i = 0; i < 1000; ++i) writer.Append(absl::StrCat(i, "\n"));
  }
  ASSERT_EQ(lseek(fd, 0, SEEK_SET), 0);  // the writer's copy shared the offset
  const std::string text = ReadAll(fd);
  close(fd);
  unlink(path);
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  ASSERT_THAT(lines, SizeIs(1000));
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(lines[i], absl::StrCat(i));
  EXPECT_THAT(warnings.Get(), ::testing::IsEmpty());
}

TEST(EventLogWriterTest, AFullDiskIsToldOnceAndNothingMoreIsTried) {
  Warnings warnings;
  {
    EventLogWriter writer(UniqueFd(open("/dev/full", O_WRONLY | O_CLOEXEC)), "--event-log full",
                          warnings.Sink());
    for (int i = 0; i < 10; ++i) writer.Append("{}\n");
  }
  EXPECT_THAT(warnings.Get(),
              ElementsAre(HasSubstr("--event-log full: cannot write (No space left on device)")));
}

// A pipe nobody reads blocks the writer's thread once it is full (64 KiB);
// Append goes on without waiting, and what does not fit in the queue is
// dropped and counted: the lines read plus those counted are all the lines.
TEST(EventLogWriterTest, AStalledFileDropsLinesAndCountsThemButNeverBlocksTheCaller) {
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  Warnings warnings;
  // The pipe holds about 700 of these lines: at least 3 x 10,000 - 700 -
  // 2 x 10,000 (a batch being written and a full queue) are dropped.
  const int total = 3 * static_cast<int>(EventLogWriter::kMaxPending);
  std::string text;
  std::thread reader;
  {
    EventLogWriter writer(UniqueFd(pipe_fds[1]), "test", warnings.Sink());
    for (int i = 0; i < total; ++i) writer.Append(absl::StrCat(std::string(90, 'x'), i, "\n"));
    reader = std::thread([&text, fd = pipe_fds[0]] { text = ReadAll(fd); });
  }  // waits for the writer's thread, then closes the pipe: the reader ends
  reader.join();
  close(pipe_fds[0]);
  uint64_t dropped = 0;
  ASSERT_THAT(warnings.Get(), ::testing::Not(::testing::IsEmpty()));
  for (const std::string& warning : warnings.Get()) {
    ASSERT_THAT(warning, ::testing::StartsWith("test: "));
    EXPECT_THAT(warning, HasSubstr(" event(s) left out"));
    uint64_t count = 0;
    ASSERT_TRUE(absl::SimpleAtoi(warning.substr(6, warning.find(' ', 6) - 6), &count)) << warning;
    dropped += count;
  }
  const std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  EXPECT_GT(dropped, 0u);
  EXPECT_EQ(lines.size() + dropped, static_cast<size_t>(total));
  // What was kept is in order.
  int64_t last = -1;
  for (const std::string& line : lines) {
    int64_t n = 0;
    ASSERT_TRUE(absl::SimpleAtoi(line.substr(90), &n)) << line;
    EXPECT_GT(n, last);
    last = n;
  }
}

}  // namespace
}  // namespace muster
