// The rendezvous's journal: where musterd --state-dir keeps every durable
// change of its jobs (JournalRecord, see proto/journal.proto), appended and
// made durable before the answer that depends on it leaves the server, and
// replayed when musterd starts again.
//
// DIR/journal is "MUSTERJ1", then records, each
//   [uint32 length][uint32 CRC-32C of the length's 4 bytes and the payload][payload]
// (little-endian), the payload a serialized JournalRecord. A record cut short
// by a crash (a torn write) or changed on disk fails its length or checksum:
// replay keeps every record before it and drops the rest of the file, saying
// so. DIR/lock keeps a second musterd out of DIR.
//
// Thread safety: Append and Compact are called by one thread at a time (the
// hub holds its lock around them, so the file's order is the state's);
// SyncTo and written() from any thread, alongside them.
#ifndef MUSTER_RENDEZVOUS_SERVER_JOURNAL_H_
#define MUSTER_RENDEZVOUS_SERVER_JOURNAL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/file_system.h"
#include "common/unique_handle.h"
#include "proto/journal.pb.h"

namespace muster::rdzv {

struct JournalOptions {
  // The journal is rewritten as a snapshot (Compact) once it holds this
  // many bytes and twice what it held after the last rewrite (or open).
  uint64_t compact_bytes = 64ull << 20;
  // Every file operation goes through it; a test's fails some. Not owned;
  // outlives the journal.
  FileSystem* files = &FileSystem::Default();
};

// What Open read back.
struct Replayed {
  std::vector<JournalRecord> records;  // every whole record, in order
  uint64_t bytes = 0;                  // the journal's size, the records kept
  // Empty when the whole file was read; else why the rest was dropped
  // ("a record's checksum does not match at byte 1234"), and how much.
  std::string dropped_why;
  uint64_t dropped_bytes = 0;
};

// Where a hub writes its durable changes: the file (Journal), or a
// simulation's memory (tests/sim). See Journal for what each call means.
class JournalWriter {
 public:
  virtual ~JournalWriter() = default;
  virtual absl::StatusOr<uint64_t> Append(const std::vector<JournalRecord>& records) = 0;
  virtual absl::Status SyncTo(uint64_t position) = 0;
  virtual uint64_t written() const = 0;
  virtual bool WantsCompaction() const = 0;
  virtual absl::Status Compact(const std::vector<JournalRecord>& snapshot) = 0;
  // Where it is kept, for messages.
  virtual const std::string& path() const = 0;
};

class Journal final : public JournalWriter {
 public:
  // Opens DIR/journal, making DIR (mode 0700) and the file (mode 0600) if
  // they do not exist, and reads it back into *replayed. A torn or corrupt
  // tail is cut off the file (see Replayed::dropped_why), so that what is
  // appended next follows the last whole record.
  // Errors: kFailedPrecondition another process holds DIR (its lock), DIR is
  // not a directory, or the file is not a journal (its first bytes are not
  // the header); kPermissionDenied and others from the system, naming the
  // path.
  static absl::StatusOr<std::unique_ptr<Journal>> Open(const std::string& dir, Replayed* replayed,
                                                       JournalOptions options = {});
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // Writes `records` at the end of the file: in the page cache, not yet
  // durable. Returns the position to give SyncTo. After an error every
  // later call fails with it: the journal no longer says what the state is.
  absl::StatusOr<uint64_t> Append(const std::vector<JournalRecord>& records) override;

  // Returns once everything appended up to `position` is on disk. Callers
  // that come while an fdatasync runs wait for it, and the next one covers
  // them all: a burst of changes costs one or two fdatasyncs, not one each.
  absl::Status SyncTo(uint64_t position) override;

  // The position after the last Append: SyncTo(written()) makes everything
  // appended so far durable.
  uint64_t written() const override;

  // Whether the file has grown enough to be rewritten (JournalOptions).
  bool WantsCompaction() const override;

  // Replaces the file with `snapshot`, the records of the state as it is
  // (RendezvousState::Snapshot): written to DIR/journal.new, synced, renamed
  // over DIR/journal, and DIR synced. Everything appended before is durable
  // when it returns OK. On an error the old file stays in place, and later
  // calls fail with it.
  absl::Status Compact(const std::vector<JournalRecord>& snapshot) override;

  const std::string& path() const override { return path_; }

 private:
  Journal(std::string dir, JournalOptions options, UniqueFd lock);

  // [length][crc][payload] of each record, appended to `out`.
  static void Encode(const std::vector<JournalRecord>& records, std::string* out);

  const std::string dir_;
  const std::string path_;
  const JournalOptions options_;
  const UniqueFd lock_;

  mutable absl::Mutex mu_;
  // Shared with an fdatasync in flight, so a Compact that replaces the file
  // cannot close the descriptor under it.
  std::shared_ptr<UniqueFd> fd_ ABSL_GUARDED_BY(mu_);
  uint64_t file_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t compacted_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // the size after the last rewrite
  // Positions count every byte ever appended, across rewrites.
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t synced_ ABSL_GUARDED_BY(mu_) = 0;
  bool syncing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_SERVER_JOURNAL_H_
