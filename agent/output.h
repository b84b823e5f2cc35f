// A worker's stdout or stderr, split into lines for the console and copied raw to a log file.
#ifndef MUSTER_AGENT_OUTPUT_H_
#define MUSTER_AGENT_OUTPUT_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/unique_handle.h"

namespace muster {

// --duplicate-stdout-filters / --duplicate-stderr-filters: the lines that
// hold one of the filters (a plain, case-sensitive substring, as torchrun
// matches them) copied, with their console prefix, to one file that every
// worker of an attempt shares. A write error drops the file (see status()).
// Not thread-safe: the agent's event loop drives it.
class LineDuplicator {
 public:
  LineDuplicator(std::vector<std::string> filters, UniqueFd file);

  // `line`: a console line, its prefix included, ending in '\n'; the
  // filters are looked for after its first `prefix_size` bytes.
  void Offer(std::string_view line, size_t prefix_size);

  const absl::Status& status() const { return status_; }

 private:
  std::vector<std::string> filters_;
  UniqueFd file_;
  absl::Status status_;
};

// Splits one worker stream (one worker's stdout, or its stderr) into lines. Each complete line
// goes, prefixed, to the console fd in one write(), so the agent never interleaves the lines of two
// ranks mid-line; the log file gets the raw bytes, unprefixed, as they arrive.
//
// Console writes are best effort and never take down the agent:
//  - SIGPIPE is blocked around them, so a closed console (EPIPE) does not kill the process whatever
//    its SIGPIPE disposition; after EPIPE or any other hard error the console is dropped for good.
//  - A non-blocking console that stays full (EAGAIN) for kConsoleStallTimeout drops that line;
//  later
//    lines are then tried once without waiting until one gets through whole.
//  - A blocking console applies back-pressure: write() blocks while its reader does not read.
// A log file write error abandons the file (see file_status()); the console keeps going.
//
// Memory: one buffer per stream holding the prefix and the pending partial line, at most
// prefix + kMaxLineBytes + 1 bytes; none at all when there is no console.
//
// Not thread-safe: one WorkerOutput is driven by one thread (the agent's event loop).
class WorkerOutput {
 public:
  // A line longer than this goes to the console in pieces of this many bytes, each prefixed and
  // ended with '\n'. The file still gets the line unchanged.
  static constexpr size_t kMaxLineBytes = 64 * 1024;
  // How long one console line may wait on a full non-blocking console before it is dropped.
  static constexpr int kConsoleStallTimeoutMs = 1000;

  // prefix: put before every console line, e.g. "[rank 3]: ". console_fd: not owned, -1 for no
  // console (filtered out, or redirected to the file only). file: owned; invalid for no log file.
  // duplicate: not owned, outlives this; null for none. It is offered every line, shown on the
  // console or not.
  WorkerOutput(std::string prefix, int console_fd, UniqueFd file,
               LineDuplicator* duplicate = nullptr);

  WorkerOutput(WorkerOutput&&) = default;
  WorkerOutput& operator=(WorkerOutput&&) = default;

  // Takes the next bytes the worker wrote, however they were cut (they need not end on a line).
  void Append(std::string_view bytes);

  // At EOF: writes a pending partial line to the console, ending it with '\n'. Bytes appended after
  // it start a new line. Destroying a WorkerOutput without Finish() drops the pending partial line
  // from the console (the file has it already).
  void Finish();

  // OK, or the first error writing the log file (after which the file was closed and skipped).
  const absl::Status& file_status() const { return file_status_; }

 private:
  bool has_pending() const { return line_.size() > prefix_size_; }
  // Whether lines are cut at all: someone reads them.
  bool wants_lines() const { return console_fd_ >= 0 || duplicate_ != nullptr; }
  void EmitLine();
  void WriteConsole(std::string_view data);
  void WriteFile(std::string_view data);

  // line_ is the prefix followed by the pending partial line, so a finished line is written as is.
  std::string line_;
  size_t prefix_size_;
  int console_fd_;
  bool console_stalled_ = false;
  LineDuplicator* duplicate_;
  UniqueFd file_;
  absl::Status file_status_;
};

// Creates path and its missing parents with mode 0700 (logs are the
// user's alone), like `mkdir -p`. OK if it exists as a
// directory; an error if it, or a parent, exists as something else.
absl::Status MakeDirs(const std::string& path);

// Opens path for writing (created 0600, truncated, close-on-exec), creating its parent directories.
absl::StatusOr<UniqueFd> OpenLogFile(const std::string& path);

}  // namespace muster

#endif  // MUSTER_AGENT_OUTPUT_H_
