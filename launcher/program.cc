#include "launcher/program.h"

#include <unistd.h>

#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "agent/child_process.h"

namespace muster {

bool IsElfFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  char magic[4] = {};
  return file.read(magic, 4) && magic[0] == 0x7f && magic[1] == 'E' && magic[2] == 'L' &&
         magic[3] == 'F';
}

absl::StatusOr<Program> ResolveProgram(const ProgramQuery& query) {
  // Programs are looked up on PATH, then beside muster (muster-allreduce).
  const std::string program_path = absl::StrCat(query.path, ":", query.self_dir);
  const std::string& script = query.script;
  if (!query.module) {
    const bool exists = access(script.c_str(), F_OK) == 0;
    // A bare name that is no file here is a command: on PATH, or beside muster.
    const bool command = script.find('/') == std::string::npos && !exists;
    absl::StatusOr<std::string> resolved = query.no_python || command
                                               ? ResolveExecutable(script, program_path)
                                               : absl::NotFoundError("a file, not a command");
    if (query.no_python) {
      if (!resolved.ok()) return absl::InvalidArgumentError(resolved.status().message());
      return Program{*resolved, true};
    }
    if (resolved.ok() && IsElfFile(*resolved)) {
      // A native program named like a command (muster-allreduce): run it directly.
      return Program{*resolved, true};
    }
    if (!exists) {
      return absl::InvalidArgumentError(absl::StrCat(
          script,
          ": no such file; give the path of a Python script, -m MODULE, or --no-python "
          "PROGRAM"));
    }
    if (IsElfFile(script)) {
      // A native program cannot run under python: run it directly.
      if (access(script.c_str(), X_OK) != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(script, " is a native program but not executable; chmod +x it"));
      }
      return Program{script, true};
    }
  }
  const std::string wanted = query.python_exec.value_or("python3");
  absl::StatusOr<std::string> interpreter = ResolveExecutable(wanted, query.path);
  if (!interpreter.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot run the Python interpreter: ", interpreter.status().message(),
                     "; set PYTHON_EXEC to its path"));
  }
  return Program{*interpreter, false};
}

}  // namespace muster
