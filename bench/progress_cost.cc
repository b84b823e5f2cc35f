// What progress reporting (MUSTER_PROGRESS_FILE, agent/progress.h) costs: a
// worker writing its step at every step, and the agent reading the files.
//
//   build/bench/progress_cost [--reports 200000] [--dir DIR]... [--python /usr/bin/python3]
//
// The worker's side, per report: Python as docs/hangs-and-gpu-check.md shows it (open, write,
// close: `with open(path, "w") as f: f.write(...)`) and the cheaper way
// (os.pwrite on a file kept open), each timed by Python itself over
// --reports reports; and the same two from C, for the system calls' share.
// The agent's side: ReadProgressFile (open, fstat, pread, parse, close) per
// call, and what the agent spends a second on a node of 8 workers (it reads
// each file once a second). The goal (issue 32): 10 µs or less per report.
// Each --dir is measured: by default /dev/shm, where the agent puts the
// files, and TMPDIR (else /tmp), its log directory's default, where it puts
// them on a node with no /dev/shm.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agent/progress.h"

namespace {

constexpr double kGoalUs = 10;

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// µs per report of `report`, called `count` times with steps 1..count.
template <typename F>
double Time(int count, F report) {
  const auto start = std::chrono::steady_clock::now();
  for (int step = 1; step <= count; ++step) report(step);
  return Seconds(std::chrono::steady_clock::now() - start) * 1e6 / count;
}

// µs per report, as Python measures its own loop; -1 when it cannot run.
double PythonReport(const std::string& python, const std::string& path, int count, bool pwrite) {
  const std::string loop =
      pwrite ? absl::StrCat("import os,time\nfd=os.open('", path,
                            "',os.O_WRONLY|os.O_CREAT,0o644)\nt=time.perf_counter()\n"
                            "for s in range(1,",
                            count + 1,
                            "):\n    os.pwrite(fd,b'%d\\n'%s,0)\n"
                            "print((time.perf_counter()-t)*1e6/",
                            count, ")\n")
             : absl::StrCat("import time\nt=time.perf_counter()\nfor s in range(1,", count + 1,
                            "):\n    with open('", path,
                            "','w') as f:\n        f.write(f'{s}\\n')\n"
                            "print((time.perf_counter()-t)*1e6/",
                            count, ")\n");
  const std::string script = path + ".py";
  FILE* file = std::fopen(script.c_str(), "w");
  if (file == nullptr) return -1;
  std::fputs(loop.c_str(), file);
  std::fclose(file);
  FILE* out = popen(absl::StrCat(python, " ", script).c_str(), "r");
  if (out == nullptr) return -1;
  double us = -1;
  if (std::fscanf(out, "%lf", &us) != 1) us = -1;
  pclose(out);
  return us;
}

void Line(const char* what, double us) {
  if (us < 0) {
    std::printf("  %-52s (could not run)\n", what);
    return;
  }
  std::printf("  %-52s %8.2f us  (%.2fx the 10 us goal)\n", what, us, us / kGoalUs);
}

// The figures of one directory's file system.
void Measure(const std::string& dir, int reports, const std::string& python) {
  std::string made = dir + "/muster-progress-XXXXXX";
  if (mkdtemp(made.data()) == nullptr) {
    std::printf("%s: cannot make a directory there (%s)\n", dir.c_str(), std::strerror(errno));
    return;
  }
  const std::string path = made + "/progress";
  std::printf("\nin %s, %d reports:\n", dir.c_str(), reports);
  std::printf("a worker, per report:\n");
  Line("Python: with open(path, 'w') as f: f.write(...)",
       PythonReport(python, path, reports, /*pwrite=*/false));
  Line("Python: os.pwrite(fd, b'%d\\n' % step, 0), fd kept",
       PythonReport(python, path, reports, /*pwrite=*/true));
  Line("C: open(O_TRUNC), write, close", Time(reports, [&](int step) {
         const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
         const std::string line = absl::StrCat(step, "\n");
         if (write(fd, line.data(), line.size()) < 0) std::abort();
         close(fd);
       }));
  const int kept = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  Line("C: pwrite at 0, fd kept", Time(reports, [&](int step) {
         const std::string line = absl::StrCat(step, "\n");
         if (pwrite(kept, line.data(), line.size(), 0) < 0) std::abort();
       }));
  close(kept);
  int64_t sum = 0;
  const double read_us = Time(reports, [&](int) {
    std::optional<muster::NodeProgress> read = muster::ReadProgressFile(path);
    if (read) sum += read->step;
  });
  std::printf("the agent:\n");
  std::printf("  %-52s %8.2f us\n", "ReadProgressFile, per read", read_us);
  std::printf("  %-52s %8.2f us a second (%.5f%% of a core)\n",
              "8 workers, each file read once a second", 8 * read_us, 8 * read_us / 1e4);
  if (sum <= 0) std::printf("(no read saw a step)\n");
  unlink(path.c_str());
  unlink((path + ".py").c_str());
  rmdir(made.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"What progress reporting costs a worker and the agent"};
  int reports = 200'000;
  const char* tmp = std::getenv("TMPDIR");
  // Where the agent puts the files (/dev/shm), and where it falls back to
  // without one (the log directory's default, TMPDIR or /tmp).
  std::vector<std::string> dirs = {"/dev/shm", tmp != nullptr && *tmp != '\0' ? tmp : "/tmp"};
  std::string python = "/usr/bin/python3";
  app.add_option("--reports", reports, "reports (and reads) timed")->check(CLI::PositiveNumber);
  app.add_option("--dir", dirs, "where the progress files go, each measured");
  app.add_option("--python", python, "the interpreter of the Python figures");
  CLI11_PARSE(app, argc, argv);
  std::printf("progress reporting: what a worker and the agent pay (goal: 10 us a report)\n");
  for (const std::string& dir : dirs) Measure(dir, reports, python);
  return 0;
}
