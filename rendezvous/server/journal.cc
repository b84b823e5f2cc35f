#include "rendezvous/server/journal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/file_system.h"
#include "common/status.h"

namespace muster::rdzv {
namespace {

constexpr absl::string_view kHeader = "MUSTERJ1";
constexpr size_t kRecordHeaderBytes = 8;
// Far above any record the state emits (a round of 65,536 nodes with every
// field at its bound is about 100 MiB): a larger length is corruption.
constexpr uint32_t kMaxRecordBytes = 256u << 20;

void PutUint32(uint32_t value, std::string* out) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

uint32_t GetUint32(const char* p) {
  uint32_t value = 0;
  for (int i = 3; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(p[i]);
  return value;
}

// Writes all of `data` at `offset`.
absl::Status WriteAt(FileSystem& fs, int fd, absl::string_view data, uint64_t offset,
                     const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = fs.PWrite(fd, data.data(), data.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("write ", path));
    }
    data.remove_prefix(static_cast<size_t>(n));
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status SyncDirectory(FileSystem& fs, const std::string& dir) {
  UniqueFd fd(fs.Open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("open ", dir));
  if (fs.FSync(fd.get()) != 0) return ErrnoToStatus(errno, absl::StrCat("fsync ", dir));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadAll(FileSystem& fs, int fd, const std::string& path) {
  std::string contents;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = fs.PRead(fd, buffer, sizeof buffer, static_cast<off_t>(contents.size()));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("read ", path));
    }
    if (n == 0) return contents;
    contents.append(buffer, static_cast<size_t>(n));
  }
}

// Reads the records of `contents` (after the header) into *replayed, up to
// the first that is not whole; says why it stopped there, if it did.
void ParseRecords(absl::string_view contents, Replayed* replayed) {
  size_t pos = kHeader.size();
  while (pos < contents.size()) {
    const size_t left = contents.size() - pos;
    std::string why;
    if (left < kRecordHeaderBytes) {
      why = absl::StrCat("a record's header is cut short at byte ", pos);
    } else {
      const uint32_t length = GetUint32(contents.data() + pos);
      const uint32_t crc = GetUint32(contents.data() + pos + 4);
      if (length > kMaxRecordBytes) {
        why =
            absl::StrCat("a record's length (", length, " bytes) is not believable at byte ", pos);
      } else if (left - kRecordHeaderBytes < length) {
        why = absl::StrCat("a record of ", length, " bytes is cut short at byte ", pos, " (",
                           left - kRecordHeaderBytes, " bytes there)");
      } else {
        const absl::string_view payload = contents.substr(pos + kRecordHeaderBytes, length);
        if (Crc32c(payload, Crc32c(contents.substr(pos, 4))) != crc) {
          why = absl::StrCat("a record's checksum does not match at byte ", pos);
        } else if (JournalRecord record;
                   !record.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
          why = absl::StrCat("a record does not parse at byte ", pos);
        } else {
          replayed->records.push_back(std::move(record));
          pos += kRecordHeaderBytes + length;
          continue;
        }
      }
    }
    replayed->dropped_why = std::move(why);
    replayed->dropped_bytes = contents.size() - pos;
    break;
  }
  replayed->bytes = pos;
}

}  // namespace

Journal::Journal(std::string dir, JournalOptions options, UniqueFd lock)
    : dir_(std::move(dir)), path_(dir_ + "/journal"), options_(options), lock_(std::move(lock)) {}

absl::StatusOr<std::unique_ptr<Journal>> Journal::Open(const std::string& dir, Replayed* replayed,
                                                       JournalOptions options) {
  *replayed = Replayed();
  FileSystem& fs = *options.files;
  if (fs.MkDir(dir, 0700) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, absl::StrCat("mkdir ", dir));
  }
  struct stat st = {};
  if (fs.Stat(dir, &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", dir));
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, " is not a directory; give --state-dir a directory of its own"));
  }
  const std::string lock_path = dir + "/lock";
  UniqueFd lock(fs.Open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock.valid()) return ErrnoToStatus(errno, absl::StrCat("open ", lock_path));
  if (fs.Flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("another process uses the state directory ", dir, " (it holds ", lock_path,
                       "); give each musterd a directory of its own"));
    }
    return ErrnoToStatus(errno, absl::StrCat("flock ", lock_path));
  }

  std::unique_ptr<Journal> journal(new Journal(dir, options, std::move(lock)));
  // Holds node secrets: for this user only, whatever the umask.
  auto fd = std::make_shared<UniqueFd>(fs.Open(journal->path_, O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd->valid()) return ErrnoToStatus(errno, absl::StrCat("open ", journal->path_));
  if (fs.FChmod(fd->get(), 0600) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("chmod 600 ", journal->path_));
  }
  absl::StatusOr<std::string> contents = ReadAll(fs, fd->get(), journal->path_);
  if (!contents.ok()) return contents.status();

  if (contents->size() < kHeader.size() &&
      absl::string_view(kHeader).substr(0, contents->size()) == *contents) {
    // New, or its header torn as it was first written: nothing was in it.
    if (!contents->empty()) {
      replayed->dropped_why = "the journal's header is cut short";
      replayed->dropped_bytes = contents->size();
    }
    if (fs.FTruncate(fd->get(), 0) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("truncate ", journal->path_));
    }
    MUSTER_RETURN_IF_ERROR(WriteAt(fs, fd->get(), kHeader, 0, journal->path_));
    if (fs.FSync(fd->get()) != 0)
      return ErrnoToStatus(errno, absl::StrCat("fsync ", journal->path_));
    MUSTER_RETURN_IF_ERROR(SyncDirectory(fs, dir));
    replayed->bytes = kHeader.size();
  } else if (!absl::StartsWith(*contents, kHeader)) {
    return absl::FailedPreconditionError(
        absl::StrCat(journal->path_, " is not a muster journal (it does not start with ", kHeader,
                     "); move it away, or give --state-dir another directory"));
  } else {
    ParseRecords(*contents, replayed);
    if (replayed->dropped_bytes > 0) {
      // What is appended next must follow the last whole record.
      if (fs.FTruncate(fd->get(), static_cast<off_t>(replayed->bytes)) != 0) {
        return ErrnoToStatus(errno, absl::StrCat("truncate ", journal->path_));
      }
      if (fs.FSync(fd->get()) != 0) {
        return ErrnoToStatus(errno, absl::StrCat("fsync ", journal->path_));
      }
    }
  }
  absl::MutexLock lock_mu(&journal->mu_);
  journal->fd_ = std::move(fd);
  journal->file_bytes_ = replayed->bytes;
  journal->compacted_bytes_ = replayed->bytes;
  return journal;
}

void Journal::Encode(const std::vector<JournalRecord>& records, std::string* out) {
  std::string payload;
  for (const JournalRecord& record : records) {
    payload.clear();
    record.SerializeToString(&payload);
    std::string length;
    PutUint32(static_cast<uint32_t>(payload.size()), &length);
    out->append(length);
    PutUint32(Crc32c(payload, Crc32c(length)), out);
    out->append(payload);
  }
}

absl::StatusOr<uint64_t> Journal::Append(const std::vector<JournalRecord>& records) {
  std::string data;
  Encode(records, &data);
  absl::MutexLock lock(&mu_);
  if (!failed_.ok()) return failed_;
  if (data.empty()) return written_;
  // Written without the lock would let SyncTo read a position whose bytes
  // are not in the file yet; a write to the page cache is short.
  if (absl::Status status = WriteAt(*options_.files, fd_->get(), data, file_bytes_, path_);
      !status.ok()) {
    failed_ = status;
    return status;
  }
  file_bytes_ += data.size();
  written_ += data.size();
  return written_;
}

absl::Status Journal::SyncTo(uint64_t position) {
  absl::MutexLock lock(&mu_);
  while (synced_ < position) {
    if (!failed_.ok()) return failed_;
    if (syncing_) {
      mu_.Await(absl::Condition(
          +[](Journal* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) { return !self->syncing_; },
          this));
      continue;
    }
    syncing_ = true;
    const uint64_t target = written_;
    const std::shared_ptr<UniqueFd> fd = fd_;
    mu_.Unlock();
    const int rc = options_.files->FDataSync(fd->get());
    const int error = errno;
    mu_.Lock();
    syncing_ = false;
    if (rc != 0) {
      failed_ = ErrnoToStatus(error, absl::StrCat("fdatasync ", path_));
      return failed_;
    }
    if (target > synced_) synced_ = target;
  }
  return failed_;
}

uint64_t Journal::written() const {
  absl::MutexLock lock(&mu_);
  return written_;
}

bool Journal::WantsCompaction() const {
  absl::MutexLock lock(&mu_);
  return failed_.ok() && file_bytes_ >= options_.compact_bytes &&
         file_bytes_ >= 2 * compacted_bytes_;
}

absl::Status Journal::Compact(const std::vector<JournalRecord>& snapshot) {
  {
    absl::MutexLock lock(&mu_);
    if (!failed_.ok()) return failed_;
  }
  std::string data(kHeader);
  Encode(snapshot, &data);
  const std::string fresh_path = path_ + ".new";
  FileSystem& fs = *options_.files;
  absl::Status status = [&]() -> absl::Status {
    auto fresh = std::make_shared<UniqueFd>(
        fs.Open(fresh_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!fresh->valid()) return ErrnoToStatus(errno, absl::StrCat("open ", fresh_path));
    MUSTER_RETURN_IF_ERROR(WriteAt(fs, fresh->get(), data, 0, fresh_path));
    if (fs.FSync(fresh->get()) != 0)
      return ErrnoToStatus(errno, absl::StrCat("fsync ", fresh_path));
    if (fs.Rename(fresh_path, path_) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("rename ", fresh_path, " to ", path_));
    }
    MUSTER_RETURN_IF_ERROR(SyncDirectory(fs, dir_));
    absl::MutexLock lock(&mu_);
    fd_ = std::move(fresh);
    file_bytes_ = data.size();
    compacted_bytes_ = data.size();
    synced_ = written_;  // all of it is in the snapshot, on disk
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    fs.Unlink(fresh_path);
    absl::MutexLock lock(&mu_);
    failed_ = status;
  }
  return status;
}

}  // namespace muster::rdzv
