// How a worker tells its agent how far it got: it writes its step (and,
// optionally, a count of its choosing: samples, tokens) to the file named by
// MUSTER_PROGRESS_FILE, "STEP [COUNT]" on one line, overwriting it. Two lines
// in a training loop, no package needed:
//
//   with open(os.environ["MUSTER_PROGRESS_FILE"], "w") as f:
//       f.write(f"{step}\n")
//
// or, cheaper, keep it open and os.pwrite(fd, b"%d\n" % step, 0) (a step only
// grows, so the line never shrinks). The agent reads the files once a second.
// They live in a private directory on /dev/shm where there is one (a write
// costs a few microseconds; on ext4 a truncated file rewritten is flushed
// at its close, a tenth of a millisecond), else beside the rank's logs.
#ifndef MUSTER_AGENT_PROGRESS_H_
#define MUSTER_AGENT_PROGRESS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "agent/elastic_state.h"

namespace muster {

inline constexpr char kProgressFileEnv[] = "MUSTER_PROGRESS_FILE";
// What the agent reads of a progress file at most: one line.
inline constexpr size_t kMaxProgressLine = 64;

struct StepLine {
  int64_t step = 0;
  int64_t count = 0;
};

// The first line of `text`: a step, optionally a count after white space,
// each 0..2^53. nullopt for anything else (an empty file caught between a
// truncation and its write, text, a negative number): the read is skipped.
std::optional<StepLine> ParseProgress(absl::string_view text);

// What the file at `path` says, dated by its modification time; nullopt
// when it does not exist yet or says nothing ParseProgress accepts.
std::optional<NodeProgress> ReadProgressFile(const std::string& path);

}  // namespace muster

#endif  // MUSTER_AGENT_PROGRESS_H_
