#include "agent/gpu_check.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace muster {
namespace {

// Utilization samples are read at least this often: NVML keeps only the
// last 15 to 20 seconds of them.
constexpr absl::Duration kMaxSamplePeriod = absl::Seconds(10);
// A process and its ancestors looked at before giving up on it.
constexpr int kMaxAncestors = 64;

// "0-3", "0, 2, 5-7".
std::string Ranges(const std::vector<int>& sorted) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    parts.push_back(j == i       ? absl::StrCat(sorted[i])
                    : j == i + 1 ? absl::StrCat(sorted[i], ", ", sorted[j])
                                 : absl::StrCat(sorted[i], "-", sorted[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ", ");
}

std::string Plural(size_t n, absl::string_view one, absl::string_view many) {
  return std::string(n == 1 ? one : many);
}

std::string GiB(uint64_t bytes) {
  return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
}

std::string Seconds(absl::Duration d) {
  return absl::StrFormat("%.0f s", absl::ToDoubleSeconds(d));
}

}  // namespace

absl::StatusOr<std::vector<int>> NodeGpus(const std::optional<std::string>& visible,
                                          const std::vector<std::string>& uuids, int nproc) {
  std::vector<int> gpus;
  if (!visible) {
    for (size_t i = 0; i < uuids.size(); ++i) gpus.push_back(static_cast<int>(i));
  } else {
    for (absl::string_view entry : absl::StrSplit(*visible, ',', absl::SkipWhitespace())) {
      entry = absl::StripAsciiWhitespace(entry);
      int index = -1;
      if (absl::StartsWith(entry, "MIG-")) {
        return absl::InvalidArgumentError(
            absl::StrCat("CUDA_VISIBLE_DEVICES names a MIG instance (", entry,
                         "): NVML's process lists do not tell instances apart"));
      }
      if (absl::StartsWith(entry, "GPU-")) {
        for (size_t i = 0; i < uuids.size(); ++i) {
          if (!absl::StartsWith(uuids[i], entry)) continue;
          if (index >= 0) {
            return absl::InvalidArgumentError(absl::StrCat(
                "CUDA_VISIBLE_DEVICES entry ", entry, " is the start of more than one GPU's UUID"));
          }
          index = static_cast<int>(i);
        }
      } else if (!absl::SimpleAtoi(entry, &index) || index < 0 ||
                 index >= static_cast<int>(uuids.size())) {
        index = -1;
      }
      if (index < 0) {
        return absl::InvalidArgumentError(absl::StrCat("CUDA_VISIBLE_DEVICES entry '", entry,
                                                       "' names none of the ", uuids.size(),
                                                       " GPUs NVML sees"));
      }
      gpus.push_back(index);
    }
  }
  if (nproc >= 0 && gpus.size() > static_cast<size_t>(nproc)) gpus.resize(nproc);
  return gpus;
}

GpuCheck::GpuCheck(GpuSource& source, GpuCheckOptions options,
                   std::function<pid_t(pid_t)> parent_of)
    : source_(source), options_(std::move(options)), parent_of_(std::move(parent_of)) {}

void GpuCheck::RoundStarted(std::vector<GpuWorker> workers, absl::Time now) {
  workers_.clear();
  for (const GpuWorker& worker : workers) workers_[worker.pid] = worker;
  windows_.clear();
  for (int gpu : options_.gpus) windows_[gpu].since = absl::ToUnixMicros(now);
  window_start_ = now;
  next_check_ = now + std::min(options_.first_check, options_.interval);
  next_sample_ = now + std::min(options_.interval, kMaxSamplePeriod);
  next_report_.reset();
  // A new round's processes: its pictures are said afresh.
  shared_seen_.clear();
  shared_said_.clear();
  idle_said_.clear();
  if (workers_.empty()) RoundEnded();
}

void GpuCheck::RoundEnded() {
  workers_.clear();
  next_check_.reset();
  next_sample_.reset();
}

void GpuCheck::AwaitRelease(std::vector<pid_t> old_workers, pid_t agent_pid, absl::Time now,
                            absl::Duration limit) {
  release_ =
      ReleaseWait{{old_workers.begin(), old_workers.end()}, agent_pid, now, now + limit, now};
}

std::vector<GpuHolder> GpuCheck::OldRoundHolders(GpuCheckOutput& out) {
  std::vector<GpuHolder> holders;
  for (int gpu : options_.gpus) {
    absl::StatusOr<std::vector<pid_t>> pids = source_.ReadProcesses(gpu);
    if (!pids.ok()) {
      ReadError(gpu, pids.status(), out);
      continue;
    }
    for (pid_t pid : *pids) {
      bool old = release_->old_workers.contains(pid);
      // A bound on the walk: a pid namespace is at most this deep in parents.
      pid_t up = pid;
      for (int steps = 0; !old && up > 1 && steps < 4096; ++steps) {
        up = parent_of_(up);
        old = up == release_->agent_pid;
      }
      if (old) holders.push_back({pid, gpu});
    }
  }
  return holders;
}

void GpuCheck::LookForRelease(absl::Time now, GpuCheckOutput& out) {
  if (!release_ || now < release_->next_look) return;
  std::vector<GpuHolder> holders = OldRoundHolders(out);
  if (holders.empty() || now >= release_->deadline) {
    out.release.emplace();
    out.release->waited = now - release_->started;
    out.release->holders = std::move(holders);
    release_.reset();
    return;
  }
  release_->next_look = std::min(now + kReleasePoll, release_->deadline);
}

std::optional<absl::Time> GpuCheck::NextDeadline() const {
  std::optional<absl::Time> next;
  if (next_check_ && next_sample_) next = std::min(*next_check_, *next_sample_);
  if (release_ && (!next || release_->next_look < *next)) next = release_->next_look;
  return next;
}

const char* HardwareXidName(uint64_t xid) {
  // NVIDIA's Xid catalog: the errors of the GPU, its memory and its links.
  switch (xid) {
    case 48: return "a double-bit ECC error";
    case 61: return "an internal micro-controller breakpoint";
    case 62: return "an internal micro-controller halt";
    case 64: return "an ECC page retirement or row remapping failure";
    case 74: return "an NVLink error";
    case 79: return "the GPU has fallen off the bus";
    case 92: return "a high single-bit ECC error rate";
    case 94: return "a contained ECC error";
    case 95: return "an uncontained ECC error";
    case 119: return "a GSP RPC timeout";
    case 120: return "a GSP error";
    case 140: return "an unrecovered ECC error";
    default: return nullptr;
  }
}

std::optional<std::string> HealthFault(const GpuSource::Health& health, uint64_t ecc_baseline) {
  if (health.lost) return "it has fallen off the bus or is otherwise lost (NVML: GPU is lost)";
  if (health.row_remap_failed) return "a row remapping failed (the memory is bad)";
  if (health.ecc_uncorrected > ecc_baseline) {
    return absl::StrCat(health.ecc_uncorrected - ecc_baseline, " uncorrectable ECC error(s)");
  }
  if (health.retired_pages_pending) return "retired pages are pending (it needs a reset)";
  if (health.row_remap_pending) return "a row remapping is pending (it needs a reset)";
  return std::nullopt;
}

void GpuCheck::CheckHealth(GpuCheckOutput& out) {
  const std::set<int> node_gpus(options_.gpus.begin(), options_.gpus.end());
  auto fault = [&](int gpu, const std::string& what) {
    if (!faults_said_.insert(gpu).second) return;
    const std::string uuid =
        gpu >= 0 && static_cast<size_t>(gpu) < source_.uuids().size() ? source_.uuids()[gpu] : "";
    out.faults.push_back(absl::StrCat("GPU ", gpu, uuid.empty() ? "" : " (", uuid,
                                      uuid.empty() ? "" : ")", ": ", what));
  };
  for (const GpuSource::Xid& xid : source_.TakeXids()) {
    const char* name = HardwareXidName(xid.xid);
    if (name != nullptr && node_gpus.contains(xid.index)) {
      fault(xid.index, absl::StrCat("Xid ", xid.xid, ", ", name));
    }
  }
  for (int gpu : options_.gpus) {
    absl::StatusOr<GpuSource::Health> health = source_.ReadHealth(gpu);
    if (!health.ok()) {
      ReadError(gpu, health.status(), out);
      continue;
    }
    // The first look is the baseline: errors before this agent are the
    // driver's history, not a fault of this job's.
    auto [baseline, first] = ecc_baseline_.try_emplace(gpu, health->ecc_uncorrected);
    (void)first;
    if (std::optional<std::string> what = HealthFault(*health, baseline->second)) {
      fault(gpu, *what);
    }
  }
}

GpuCheckOutput GpuCheck::CheckHealthNow() {
  GpuCheckOutput out;
  out.health_checked = true;
  CheckHealth(out);
  const int seen = static_cast<int>(options_.gpus.size());
  if (options_.expected_gpus > 0 && seen < options_.expected_gpus) {
    out.faults.push_back(absl::StrCat("NVML shows ", seen, " of this node's GPUs, and ",
                                      options_.expected_gpus,
                                      " were asked for (--nproc-per-node gpu): one is lost"));
  }
  return out;
}

GpuCheckOutput GpuCheck::OnTimer(absl::Time now) {
  GpuCheckOutput out;
  LookForRelease(now, out);
  if (!next_check_ || !next_sample_) return out;
  const bool check = now >= *next_check_;
  if (check || now >= *next_sample_) {
    CheckHealth(out);
    Sample(out);
    next_sample_ = now + std::min(options_.interval, kMaxSamplePeriod);
  }
  if (check) {
    next_check_ = now + options_.interval;
    // A full check judges idleness: a whole interval of samples is in.
    Check(now, now - window_start_ >= options_.interval, out);
  }
  return out;
}

void GpuCheck::Sample(GpuCheckOutput& out) {
  for (auto& [gpu, window] : windows_) {
    absl::StatusOr<GpuSource::Utilization> read = source_.ReadUtilization(gpu, window.since);
    if (!read.ok()) {
      ReadError(gpu, read.status(), out);
      continue;
    }
    window.samples += read->samples;
    window.max_percent = std::max(window.max_percent, read->max_percent);
    window.sum_percent += read->sum_percent;
    window.since = std::max(window.since, read->last);
  }
}

int GpuCheck::LocalRankOf(pid_t pid) const {
  for (int step = 0; step < kMaxAncestors && pid > 1; ++step) {
    auto it = workers_.find(pid);
    if (it != workers_.end()) return it->second.local_rank;
    pid = parent_of_(pid);
  }
  return -1;
}

void GpuCheck::ReadError(int gpu, const absl::Status& status, GpuCheckOutput& out) {
  if (!errors_said_.insert(gpu).second) return;
  out.errors.push_back(absl::StrCat("GPU check: GPU ", gpu, " cannot be read (", status.message(),
                                    "); what cannot be read is left out"));
}

GpuCheck::Look GpuCheck::ReadGpus(bool full, GpuCheckOutput& out) {
  Look look;
  for (const auto& [pid, worker] : workers_) look.rank_of_local[worker.local_rank] = worker.rank;
  look.node_gpus = std::set<int>(options_.gpus.begin(), options_.gpus.end());
  for (int gpu : look.node_gpus) {
    std::set<int>& ranks = look.on[gpu];
    absl::StatusOr<std::vector<pid_t>> pids = source_.ReadProcesses(gpu);
    if (!pids.ok()) {
      ReadError(gpu, pids.status(), out);
      look.on.erase(gpu);  // unknown: neither shared nor unused
      continue;
    }
    for (pid_t pid : *pids) {
      const int local_rank = LocalRankOf(pid);
      if (local_rank >= 0) ranks.insert(local_rank);
    }
    look.any_on_gpu |= !ranks.empty();
  }
  if (!full) return look;
  for (int gpu : look.node_gpus) {
    absl::StatusOr<GpuSource::Memory> read = source_.ReadMemory(gpu);
    if (read.ok()) {
      look.memory[gpu] = *read;
    } else {
      ReadError(gpu, read.status(), out);
    }
  }
  return look;
}

std::string GpuCheck::Busy(int gpu) {
  const Window& w = windows_[gpu];
  return w.samples == 0 ? std::string("n/a") : absl::StrFormat("%.0f%%", w.mean());
}

void GpuCheck::CheckShared(absl::Time now, Look& look, GpuCheckOutput& out) {
  // Shared GPUs while another runs none of this node's ranks.
  std::vector<int> shared;
  for (const auto& [gpu, ranks] : look.on) {
    if (ranks.size() >= 2) shared.push_back(gpu);
    if (ranks.empty()) look.unused.push_back(gpu);
  }
  if (!shared.empty() && !look.unused.empty()) {
    for (int gpu : shared) {
      absl::StrAppend(&look.shared_key, "gpu ", gpu, ":", absl::StrJoin(look.on[gpu], ","), ";");
    }
    absl::StrAppend(&look.shared_key, "unused ", absl::StrJoin(look.unused, ","));
  }
  const std::string& key = look.shared_key;
  if (look.any_on_gpu && key != shared_said_) {
    if (key.empty()) {
      out.cleared.push_back(
          "GPU check: no GPU of this node is shared while another runs none of its ranks any "
          "more");
      shared_said_.clear();
    } else if (key == shared_seen_) {
      out.warnings.push_back(SharedWarning(look, shared));
      shared_said_ = key;
    } else {
      // Seen once: a rank may not have moved to its own GPU yet. Look again soon.
      shared_seen_ = key;
      next_check_ = std::min(*next_check_, now + std::min(options_.confirm, options_.interval));
    }
  }
  if (key.empty() || key == shared_said_) shared_seen_.clear();
}

std::string GpuCheck::SharedWarning(Look& look, const std::vector<int>& shared) {
  auto global = [&](const std::set<int>& locals) {
    std::vector<int> ranks;
    for (int local : locals) ranks.push_back(look.rank_of_local[local]);
    std::sort(ranks.begin(), ranks.end());
    return ranks;
  };
  std::vector<std::string> groups;
  for (int gpu : shared) {
    const std::vector<int> locals(look.on[gpu].begin(), look.on[gpu].end());
    std::string used = Busy(gpu);
    if (look.memory.contains(gpu)) {
      absl::StrAppend(&used, " busy, ", GiB(look.memory[gpu].used), " used");
    } else {
      absl::StrAppend(&used, " busy");
    }
    groups.push_back(absl::StrCat("local ranks ", Ranges(locals), " (ranks ",
                                  Ranges(global(look.on[gpu])), ") share GPU ", gpu, " (", used,
                                  ")"));
  }
  std::vector<std::string> idle_busy;
  for (int gpu : look.unused) idle_busy.push_back(Busy(gpu));
  return absl::StrCat(
      "GPU check: ", absl::StrJoin(groups, "; "), ", while ",
      Plural(look.unused.size(), "GPU ", "GPUs "), Ranges(look.unused), " of this node ",
      Plural(look.unused.size(), "runs", "run"), " none of them (", absl::StrJoin(idle_busy, ", "),
      " busy). The script most likely never sets its device: call "
      "torch.cuda.set_device(int(os.environ[\"LOCAL_RANK\"])) before it creates the model or "
      "the process group, and move the model to cuda:LOCAL_RANK, not cuda");
}

void GpuCheck::CheckIdle(absl::Time now, Look& look, GpuCheckOutput& out) {
  // Idle GPUs while others work; those the shared warning names are left to it.
  std::vector<int> idle, working;
  for (int gpu : look.node_gpus) {
    const Window& w = windows_[gpu];
    if (w.samples == 0) continue;
    if (w.max_percent > 0) {
      working.push_back(gpu);
    } else if (look.shared_key.empty() ||
               std::find(look.unused.begin(), look.unused.end(), gpu) == look.unused.end()) {
      idle.push_back(gpu);
    }
  }
  if (working.empty()) idle.clear();
  for (int gpu : idle) {
    if (idle_said_.contains(gpu)) continue;
    idle_said_.insert(gpu);
    out.warnings.push_back(IdleWarning(now, look, gpu, working));
  }
  for (auto it = idle_said_.begin(); it != idle_said_.end();) {
    const Window& w = windows_[*it];
    if (w.samples > 0 && w.max_percent > 0) {
      out.cleared.push_back(
          absl::StrCat("GPU check: GPU ", *it, " works now (", Busy(*it), " busy)"));
      it = idle_said_.erase(it);
    } else {
      ++it;
    }
  }
}

std::string GpuCheck::IdleWarning(absl::Time now, Look& look, int gpu,
                                  const std::vector<int>& working) {
  std::vector<int> owners;  // the local ranks this GPU is given to
  for (size_t i = 0; i < look.rank_of_local.size() && !options_.gpus.empty(); ++i) {
    if (options_.gpus[i % options_.gpus.size()] == gpu) owners.push_back(static_cast<int>(i));
  }
  std::vector<std::string> uses;
  for (int local : owners) {
    std::vector<int> its;
    for (const auto& [other, ranks] : look.on) {
      if (ranks.contains(local)) its.push_back(other);
    }
    uses.push_back(absl::StrCat(
        "local rank ", local, " (rank ", look.rank_of_local[local], "), which ",
        its.empty() ? "uses no GPU"
                    : absl::StrCat("uses GPU", its.size() == 1 ? " " : "s ", Ranges(its))));
  }
  std::vector<std::string> others;
  for (int other : working) others.push_back(Busy(other));
  return absl::StrCat(
      "GPU check: GPU ", gpu, " of this node was idle (0% busy) for the last ",
      Seconds(now - window_start_), " while ", Plural(working.size(), "GPU ", "GPUs "),
      Ranges(working), " worked (", absl::StrJoin(others, ", "), " busy)",
      uses.empty() ? "" : absl::StrCat("; it is the GPU of ", absl::StrJoin(uses, ", and of ")),
      ". Check that every rank moves its model and data to cuda:LOCAL_RANK");
}

void GpuCheck::Report(absl::Time now, Look& look, GpuCheckOutput& out) {
  std::vector<GpuFigures> figures;
  std::vector<std::string> parts;
  for (int gpu : look.node_gpus) {
    if (!look.on.contains(gpu) || !look.memory.contains(gpu)) continue;  // could not be read
    const Window& w = windows_[gpu];
    GpuFigures& f = figures.emplace_back();
    f.index = gpu;
    f.sampled = w.samples > 0;
    f.utilization = w.mean();
    f.max_utilization = w.max_percent;
    f.memory_used = look.memory[gpu].used;
    f.memory_total = look.memory[gpu].total;
    f.local_ranks.assign(look.on[gpu].begin(), look.on[gpu].end());
    parts.push_back(
        absl::StrCat("GPU ", gpu, " ", Busy(gpu), " busy, ", GiB(f.memory_used), " of ",
                     GiB(f.memory_total), ", ",
                     f.local_ranks.empty()
                         ? std::string("no local rank")
                         : absl::StrCat(Plural(f.local_ranks.size(), "local rank ", "local ranks "),
                                        Ranges(f.local_ranks))));
  }
  out.figures = std::move(figures);
  out.figures_line = absl::StrJoin(parts, "; ");
  if (options_.report && (!next_report_ || now >= *next_report_)) {
    out.report =
        absl::StrCat("GPU report (last ", Seconds(now - window_start_), "): ", out.figures_line);
    next_report_ = now + options_.report_every;
  }
  for (auto& [gpu, window] : windows_) {
    window.samples = 0;
    window.max_percent = 0;
    window.sum_percent = 0;
  }
  window_start_ = now;
}

void GpuCheck::Check(absl::Time now, bool full, GpuCheckOutput& out) {
  Look look = ReadGpus(full, out);
  CheckShared(now, look, out);
  if (full && look.any_on_gpu) CheckIdle(now, look, out);
  if (full) Report(now, look, out);
}

}  // namespace muster
