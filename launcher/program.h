// What each worker execs: the Python interpreter that runs the script, or
// the program itself (--no-python, or a native program such as the bundled
// muster-allreduce). Looks at files (existence, execute bits, an ELF magic)
// but at no process state: PATH, PYTHON_EXEC and muster's own directory are
// inputs.
#ifndef MUSTER_LAUNCHER_PROGRAM_H_
#define MUSTER_LAUNCHER_PROGRAM_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace muster {

struct ProgramQuery {
  std::string script;      // SCRIPT (or the module's name with -m)
  bool module = false;     // -m
  bool no_python = false;  // --no-python
  std::string path;        // the PATH to search
  std::string self_dir;    // the directory of the muster binary: muster-allreduce is there
  std::optional<std::string> python_exec;  // PYTHON_EXEC, when set
};

struct Program {
  std::string path;        // what to exec; a path, or a name found on PATH
  bool no_python = false;  // exec the script itself; false: `path` is the interpreter
};

// Resolves, in this order:
//  - --no-python: SCRIPT itself, found as execvp would on PATH then in
//    self_dir (see ResolveExecutable).
//  - a bare name that is no file in the working directory but an ELF
//    program on PATH or in self_dir: that program, run directly (no_python).
//  - a SCRIPT that does not exist: an error.
//  - an ELF file: run directly; an error when it is not executable.
//  - otherwise (and with -m): the interpreter, PYTHON_EXEC or "python3",
//    found on PATH only.
// Errors: kInvalidArgument, one line naming the file and the fix.
absl::StatusOr<Program> ResolveProgram(const ProgramQuery& query);

// Whether the file at `path` starts with the ELF magic: a native program.
bool IsElfFile(const std::string& path);

}  // namespace muster

#endif  // MUSTER_LAUNCHER_PROGRAM_H_
