// The journal file of musterd --state-dir: records come back as written,
// a torn or corrupt tail is dropped (and cut off the file) with the rest
// kept, a second process is kept out, syncs are shared, and a compaction
// replaces the file with a snapshot. Faults the disk gives (ENOSPC, a short
// write, a failed fdatasync or rename) come from a FileSystem that fails on
// cue.
#include "rendezvous/server/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/file_system.h"
#include "tests/support/temp_dir.h"

namespace muster::rdzv {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

JournalRecord Removed(const std::string& node) {
  JournalRecord record;
  record.mutable_node_removed()->set_job_id("job");
  record.mutable_node_removed()->set_node_id(node);
  return record;
}

std::vector<std::string> Nodes(const std::vector<JournalRecord>& records) {
  std::vector<std::string> nodes;
  for (const JournalRecord& record : records) nodes.push_back(record.node_removed().node_id());
  return nodes;
}

// The real file system, failing on cue. Thread safety: any thread.
class FaultyFiles : public FileSystem {
 public:
  // Writes fail with `error` (ENOSPC: the disk is full) once `bytes` more
  // bytes have been written; a write that crosses the line is cut short
  // there, as the kernel does.
  void FailWritesAfter(size_t bytes, int error) {
    absl::MutexLock lock(&mu_);
    write_budget_ = bytes;
    write_error_ = error;
  }
  // Every write writes at most `bytes` bytes (and says so): a short write.
  void ShortWrites(size_t bytes) {
    absl::MutexLock lock(&mu_);
    short_writes_ = bytes;
  }
  void FailDataSyncs(int error) {
    absl::MutexLock lock(&mu_);
    data_sync_error_ = error;
  }
  void FailRenames(int error) {
    absl::MutexLock lock(&mu_);
    rename_error_ = error;
  }
  int writes() const {
    absl::MutexLock lock(&mu_);
    return writes_;
  }

  ssize_t PWrite(int fd, const void* data, size_t size, off_t offset) override {
    {
      absl::MutexLock lock(&mu_);
      ++writes_;
      if (short_writes_ > 0) size = std::min(size, short_writes_);
      if (write_error_ != 0) {
        if (write_budget_ == 0) {
          errno = write_error_;
          return -1;
        }
        size = std::min(size, write_budget_);
        write_budget_ -= size;
      }
    }
    return FileSystem::PWrite(fd, data, size, offset);
  }
  int FDataSync(int fd) override {
    absl::MutexLock lock(&mu_);
    if (data_sync_error_ == 0) return FileSystem::FDataSync(fd);
    errno = data_sync_error_;
    return -1;
  }
  int Rename(const std::string& from, const std::string& to) override {
    absl::MutexLock lock(&mu_);
    if (rename_error_ == 0) return FileSystem::Rename(from, to);
    errno = rename_error_;
    return -1;
  }

 private:
  mutable absl::Mutex mu_;
  size_t write_budget_ ABSL_GUARDED_BY(mu_) = 0;
  int write_error_ ABSL_GUARDED_BY(mu_) = 0;
  size_t short_writes_ ABSL_GUARDED_BY(mu_) = 0;
  int data_sync_error_ ABSL_GUARDED_BY(mu_) = 0;
  int rename_error_ ABSL_GUARDED_BY(mu_) = 0;
  int writes_ ABSL_GUARDED_BY(mu_) = 0;
};

class JournalTest : public ::testing::Test {
 protected:
  std::unique_ptr<Journal> Open(Replayed* replayed, JournalOptions options = {}) {
    absl::StatusOr<std::unique_ptr<Journal>> journal = Journal::Open(dir_, replayed, options);
    EXPECT_TRUE(journal.ok()) << journal.status();
    return journal.ok() ? *std::move(journal) : nullptr;
  }

  // Writes records a, b, c, each synced, and closes the journal.
  void WriteThree() {
    Replayed replayed;
    std::unique_ptr<Journal> journal = Open(&replayed);
    ASSERT_NE(journal, nullptr);
    for (const char* node : {"a", "b", "c"}) {
      absl::StatusOr<uint64_t> position = journal->Append({Removed(node)});
      ASSERT_TRUE(position.ok()) << position.status();
      ASSERT_TRUE(journal->SyncTo(*position).ok());
    }
  }

  std::string Path() const { return dir_ + "/journal"; }
  uint64_t Size() const { return std::filesystem::file_size(Path()); }
  std::string Contents() const { return support::ReadFile(Path()); }
  void SetContents(const std::string& contents) const {
    EXPECT_TRUE(support::WriteFile(Path(), contents));
  }

  support::TempDir root_{"journal-test"};
  const std::string dir_ = root_.Path("state");
};

TEST_F(JournalTest, ANewDirectoryAndJournalAreForThisUserOnly) {
  Replayed replayed;
  ASSERT_NE(Open(&replayed), nullptr);
  EXPECT_THAT(replayed.records, IsEmpty());
  EXPECT_EQ(replayed.dropped_why, "");
  struct stat st = {};
  ASSERT_EQ(stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat(Path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "it holds node secrets";
  EXPECT_EQ(Contents(), "MUSTERJ1");
}

TEST_F(JournalTest, RecordsComeBackInOrder) {
  WriteThree();
  Replayed replayed;
  ASSERT_NE(Open(&replayed), nullptr);
  EXPECT_EQ(Nodes(replayed.records), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(replayed.bytes, Size());
  EXPECT_EQ(replayed.dropped_why, "");
}

TEST_F(JournalTest, ARecordCutShortReplaysToTheLastWholeRecordAndIsCutOff) {
  WriteThree();
  const uint64_t whole = Size();
  // A crash in the middle of writing record c: a few of its bytes made it.
  ASSERT_EQ(truncate(Path().c_str(), static_cast<off_t>(whole - 3)), 0);
  Replayed replayed;
  std::unique_ptr<Journal> journal = Open(&replayed);
  ASSERT_NE(journal, nullptr);
  EXPECT_EQ(Nodes(replayed.records), (std::vector<std::string>{"a", "b"}));
  EXPECT_THAT(replayed.dropped_why, HasSubstr("cut short"));
  EXPECT_GT(replayed.dropped_bytes, 0u);
  EXPECT_EQ(Size(), replayed.bytes) << "the torn tail is cut off the file";
  // What comes next follows b, and is read back.
  ASSERT_TRUE(journal->SyncTo(*journal->Append({Removed("d")})).ok());
  journal.reset();
  Replayed again;
  ASSERT_NE(Open(&again), nullptr);
  EXPECT_EQ(Nodes(again.records), (std::vector<std::string>{"a", "b", "d"}));
  EXPECT_EQ(again.dropped_why, "");
}

TEST_F(JournalTest, EveryCutOfTheLastRecordKeepsTheOthers) {
  WriteThree();
  const std::string whole = Contents();
  Replayed two;
  {
    SetContents(whole);
    ASSERT_EQ(truncate(Path().c_str(), static_cast<off_t>(whole.size() - 1)), 0);
    ASSERT_NE(Open(&two), nullptr);
  }
  const size_t start_of_c = two.bytes;
  for (size_t cut = start_of_c + 1; cut < whole.size(); ++cut) {
    SetContents(whole.substr(0, cut));
    Replayed replayed;
    ASSERT_NE(Open(&replayed), nullptr) << cut;
    EXPECT_EQ(Nodes(replayed.records), (std::vector<std::string>{"a", "b"})) << cut;
    EXPECT_EQ(replayed.dropped_bytes, cut - start_of_c) << cut;
  }
}

TEST_F(JournalTest, ACorruptRecordIsFoundByItsChecksumAndEndsTheReplay) {
  WriteThree();
  std::string contents = Contents();
  contents[contents.size() - 2] ^= 0x01;  // inside record c's payload
  SetContents(contents);
  Replayed replayed;
  ASSERT_NE(Open(&replayed), nullptr);
  EXPECT_EQ(Nodes(replayed.records), (std::vector<std::string>{"a", "b"}));
  EXPECT_THAT(replayed.dropped_why, HasSubstr("checksum does not match"));
}

TEST_F(JournalTest, AnUnbelievableLengthIsCorruption) {
  WriteThree();
  std::string contents = Contents();
  contents += std::string("\xff\xff\xff\x7f\0\0\0\0", 8);
  SetContents(contents);
  Replayed replayed;
  ASSERT_NE(Open(&replayed), nullptr);
  EXPECT_THAT(replayed.records, SizeIs(3));
  EXPECT_THAT(replayed.dropped_why, HasSubstr("not believable"));
}

TEST_F(JournalTest, AHeaderTornAsTheJournalWasMadeIsANewJournal) {
  std::filesystem::create_directory(dir_);
  SetContents("MUST");
  Replayed replayed;
  ASSERT_NE(Open(&replayed), nullptr);
  EXPECT_THAT(replayed.records, IsEmpty());
  EXPECT_EQ(Contents(), "MUSTERJ1");
}

TEST_F(JournalTest, AFileThatIsNotAJournalIsRefusedAndLeftAlone) {
  std::filesystem::create_directory(dir_);
  SetContents("some other program's data");
  Replayed replayed;
  absl::StatusOr<std::unique_ptr<Journal>> journal = Journal::Open(dir_, &replayed);
  EXPECT_EQ(journal.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(journal.status().message(), HasSubstr("is not a muster journal"));
  EXPECT_EQ(Contents(), "some other program's data");
}

TEST_F(JournalTest, ASecondOpenOfTheSameDirectoryIsRefused) {
  Replayed replayed;
  std::unique_ptr<Journal> first = Open(&replayed);
  ASSERT_NE(first, nullptr);
  absl::StatusOr<std::unique_ptr<Journal>> second = Journal::Open(dir_, &replayed);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("another process uses the state directory"));
  first.reset();
  EXPECT_NE(Open(&replayed), nullptr) << "free again once the first closed";
}

TEST_F(JournalTest, AStateDirThatIsAFileIsRefused) {
  std::ofstream(dir_) << "x";
  Replayed replayed;
  absl::StatusOr<std::unique_ptr<Journal>> journal = Journal::Open(dir_, &replayed);
  EXPECT_EQ(journal.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(journal.status().message(), HasSubstr("is not a directory"));
}

TEST_F(JournalTest, ManyWritersShareTheirSyncs) {
  Replayed replayed;
  std::unique_ptr<Journal> journal = Open(&replayed);
  ASSERT_NE(journal, nullptr);
  constexpr int kThreads = 8, kEach = 50;
  absl::Mutex order;  // appends in one order, as the hub's lock makes them
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        absl::StatusOr<uint64_t> position;
        {
          absl::MutexLock lock(&order);
          position = journal->Append({Removed(absl::StrCat(t, ".", i))});
        }
        ASSERT_TRUE(position.ok());
        ASSERT_TRUE(journal->SyncTo(*position).ok());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  journal.reset();
  ASSERT_NE(Open(&replayed), nullptr);
  EXPECT_THAT(replayed.records, SizeIs(kThreads * kEach));
}

TEST_F(JournalTest, ACompactionReplacesTheFileWithTheSnapshot) {
  Replayed replayed;
  std::unique_ptr<Journal> journal = Open(&replayed, JournalOptions{.compact_bytes = 1024});
  ASSERT_NE(journal, nullptr);
  uint64_t position = 0;
  for (int i = 0; !journal->WantsCompaction(); ++i) {
    ASSERT_LT(i, 1000) << "never wanted a compaction";
    position = *journal->Append({Removed(absl::StrCat("n", i))});
  }
  EXPECT_GE(Size(), 1024u);
  ASSERT_TRUE(journal->Compact({Removed("kept")}).ok());
  EXPECT_FALSE(journal->WantsCompaction());
  EXPECT_TRUE(journal->SyncTo(position).ok()) << "what came before is in the snapshot";
  EXPECT_FALSE(std::filesystem::exists(Path() + ".new"));
  // Appends go on in the new file, after the snapshot.
  ASSERT_TRUE(journal->SyncTo(*journal->Append({Removed("after")})).ok());
  EXPECT_GT(journal->written(), position);
  journal.reset();
  ASSERT_NE(Open(&replayed), nullptr);
  EXPECT_EQ(Nodes(replayed.records), (std::vector<std::string>{"kept", "after"}));
  struct stat st = {};
  ASSERT_EQ(stat(Path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(JournalTest, AFailedCompactionLeavesTheOldFileAndFailsWhatFollows) {
  Replayed replayed;
  std::unique_ptr<Journal> journal = Open(&replayed);
  ASSERT_NE(journal, nullptr);
  ASSERT_TRUE(journal->SyncTo(*journal->Append({Removed("a")})).ok());
  // Where the new file would go is taken by a directory: its open fails.
  std::filesystem::create_directory(Path() + ".new");
  absl::Status compacted = journal->Compact({Removed("snapshot")});
  EXPECT_FALSE(compacted.ok());
  EXPECT_THAT(compacted.message(), HasSubstr("journal.new"));
  EXPECT_FALSE(journal->Append({Removed("b")}).ok()) << "no longer says what the state is";
  journal.reset();
  std::filesystem::remove(Path() + ".new");
  ASSERT_NE(Open(&replayed), nullptr);
  EXPECT_EQ(Nodes(replayed.records), (std::vector<std::string>{"a"}));
}

TEST_F(JournalTest, AFullDiskFailsTheAppendAndEverythingAfterItAndKeepsWhatWasWhole) {
  FaultyFiles files;
  Replayed replayed;
  std::unique_ptr<Journal> journal = Open(&replayed, JournalOptions{.files = &files});
  ASSERT_NE(journal, nullptr);
  ASSERT_TRUE(journal->SyncTo(*journal->Append({Removed("a")})).ok());
  // Room for 5 bytes more: the next record is torn on disk.
  files.FailWritesAfter(5, ENOSPC);
  absl::StatusOr<uint64_t> full = journal->Append({Removed("b")});
  ASSERT_FALSE(full.ok());
  EXPECT_THAT(full.status().message(), HasSubstr(Path()));
  EXPECT_THAT(full.status().message(), HasSubstr("No space left"));
  // The journal no longer says what the state is: nothing more is taken,
  // even once the disk has room again.
  files.FailWritesAfter(0, 0);
  EXPECT_EQ(journal->Append({Removed("c")}).status(), full.status());
  EXPECT_EQ(journal->SyncTo(journal->written() + 1), full.status());
  EXPECT_FALSE(journal->WantsCompaction());
  journal.reset();
  ASSERT_NE(Open(&replayed), nullptr);
  EXPECT_EQ(Nodes(replayed.records), (std::vector<std::string>{"a"}));
  EXPECT_THAT(replayed.dropped_why, HasSubstr("cut short"));
  EXPECT_EQ(replayed.dropped_bytes, 5u);
}

TEST_F(JournalTest, ShortWritesAreWrittenOnUntilWhole) {
  FaultyFiles files;
  files.ShortWrites(3);
  Replayed replayed;
  std::unique_ptr<Journal> journal = Open(&replayed, JournalOptions{.files = &files});
  ASSERT_NE(journal, nullptr);
  const int before = files.writes();
  for (const char* node : {"a", "b", "c"}) {
    absl::StatusOr<uint64_t> position = journal->Append({Removed(node)});
    ASSERT_TRUE(position.ok()) << position.status();
    ASSERT_TRUE(journal->SyncTo(*position).ok());
  }
  EXPECT_GT(files.writes() - before, 3 * 5) << "each record took several writes";
  journal.reset();
  ASSERT_NE(Open(&replayed), nullptr);
  EXPECT_EQ(Nodes(replayed.records), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_THAT(replayed.dropped_why, IsEmpty());
}

TEST_F(JournalTest, AFailedDataSyncIsNeverTakenForDurableAndFailsWhatFollows) {
  FaultyFiles files;
  Replayed replayed;
  std::unique_ptr<Journal> journal = Open(&replayed, JournalOptions{.files = &files});
  ASSERT_NE(journal, nullptr);
  ASSERT_TRUE(journal->SyncTo(*journal->Append({Removed("a")})).ok());
  absl::StatusOr<uint64_t> position = journal->Append({Removed("b")});
  ASSERT_TRUE(position.ok());
  // After a failed fdatasync the kernel may have dropped the dirty pages and
  // cleared the error: a second fdatasync that succeeds proves nothing.
  files.FailDataSyncs(EIO);
  absl::Status synced = journal->SyncTo(*position);
  ASSERT_FALSE(synced.ok());
  EXPECT_THAT(synced.message(), HasSubstr("fdatasync " + Path()));
  files.FailDataSyncs(0);
  EXPECT_EQ(journal->SyncTo(*position), synced) << "a later sync must not report it durable";
  EXPECT_EQ(journal->Append({Removed("c")}).status(), synced);
  EXPECT_EQ(journal->Compact({Removed("snapshot")}), synced);
}

TEST_F(JournalTest, AFailedRenameLeavesTheOldFileWhole) {
  FaultyFiles files;
  Replayed replayed;
  std::unique_ptr<Journal> journal = Open(&replayed, JournalOptions{.files = &files});
  ASSERT_NE(journal, nullptr);
  ASSERT_TRUE(journal->SyncTo(*journal->Append({Removed("a")})).ok());
  files.FailRenames(EIO);
  absl::Status compacted = journal->Compact({Removed("snapshot")});
  EXPECT_FALSE(compacted.ok());
  EXPECT_THAT(compacted.message(), HasSubstr("rename"));
  EXPECT_FALSE(std::filesystem::exists(Path() + ".new")) << "the half-made file is removed";
  journal.reset();
  ASSERT_NE(Open(&replayed), nullptr);
  EXPECT_EQ(Nodes(replayed.records), (std::vector<std::string>{"a"}));
}

}  // namespace
}  // namespace muster::rdzv
