#include "launcher/program.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace muster {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A fresh directory per test, with a bin/ for PATH and a self/ for the
// directory muster runs from. No real Python is needed: only files.
class ResolveProgramTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(bin());
    std::filesystem::create_directories(self());
  }

  std::string bin() const { return root_ + "/bin"; }
  std::string self() const { return root_ + "/self"; }
  std::string At(const std::string& name) const { return root_ + "/" + name; }

  // A file with `text`, mode `mode`; returns its path.
  static std::string Write(const std::string& path, const std::string& text, mode_t mode) {
    std::ofstream(path, std::ios::binary) << text;
    ::chmod(path.c_str(), mode);
    return path;
  }
  static std::string Elf(const std::string& path, mode_t mode = 0755) {
    return Write(path,
                 std::string("\x7f"
                             "ELF\x02\x01\x01",
                             7),
                 mode);
  }
  static std::string ShellScript(const std::string& path) {
    return Write(path, "#!/bin/sh\n", 0755);
  }

  ProgramQuery Query(const std::string& script) const {
    ProgramQuery query;
    query.script = script;
    query.path = bin();
    query.self_dir = self();
    return query;
  }

  static Program Resolve(const ProgramQuery& query) {
    absl::StatusOr<Program> program = ResolveProgram(query);
    EXPECT_TRUE(program.ok()) << program.status();
    return program.ok() ? *program : Program{"<error>", false};
  }
  static std::string Error(const ProgramQuery& query) {
    absl::StatusOr<Program> program = ResolveProgram(query);
    EXPECT_FALSE(program.ok()) << "resolved to " << program->path;
    if (program.ok()) return "";
    EXPECT_EQ(program.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(program.status().message());
  }

  support::TempDir temp_{"muster-program"};
  const std::string root_ = temp_.path();
};

TEST_F(ResolveProgramTest, PythonScriptRunsUnderPython3FromPath) {
  const std::string python = ShellScript(bin() + "/python3");
  const std::string script = Write(At("train.py"), "print(1)\n", 0644);
  const Program program = Resolve(Query(script));
  EXPECT_EQ(program.path, python);
  EXPECT_FALSE(program.no_python);
}

TEST_F(ResolveProgramTest, PythonExecNamesTheInterpreter) {
  ShellScript(bin() + "/python3");
  const std::string mine = ShellScript(bin() + "/python3.12");
  ProgramQuery query = Query(Write(At("train.py"), "", 0644));
  query.python_exec = "python3.12";
  EXPECT_EQ(Resolve(query).path, mine);
}

TEST_F(ResolveProgramTest, ModuleRunsUnderPythonWhateverItsName) {
  const std::string python = ShellScript(bin() + "/python3");
  Elf(self() + "/muster-allreduce");
  ProgramQuery query = Query("muster-allreduce");  // a module named like the bundled program
  query.module = true;
  const Program program = Resolve(query);
  EXPECT_EQ(program.path, python);
  EXPECT_FALSE(program.no_python);
}

TEST_F(ResolveProgramTest, MissingInterpreterSaysSetPythonExec) {
  ProgramQuery query = Query(Write(At("train.py"), "", 0644));
  query.python_exec = "/nonexistent/python";
  EXPECT_THAT(Error(query),
              AllOf(HasSubstr("cannot run the Python interpreter"),
                    HasSubstr("/nonexistent/python"), HasSubstr("set PYTHON_EXEC to its path")));
}

TEST_F(ResolveProgramTest, InterpreterIsNotLookedForBesideMuster) {
  ShellScript(self() + "/python3");
  EXPECT_THAT(Error(Query(Write(At("train.py"), "", 0644))), HasSubstr("PYTHON_EXEC"));
}

TEST_F(ResolveProgramTest, NoPythonFindsTheProgramOnPath) {
  const std::string tool = ShellScript(bin() + "/tool");
  ProgramQuery query = Query("tool");
  query.no_python = true;
  const Program program = Resolve(query);
  EXPECT_EQ(program.path, tool);
  EXPECT_TRUE(program.no_python);
}

TEST_F(ResolveProgramTest, NoPythonWithAPathRunsThatFile) {
  const std::string tool = ShellScript(At("tool.sh"));
  ProgramQuery query = Query(tool);
  query.no_python = true;
  EXPECT_EQ(Resolve(query).path, tool);
}

TEST_F(ResolveProgramTest, NoPythonProgramNotFoundIsNamed) {
  ProgramQuery query = Query("no-such-program-xyz");
  query.no_python = true;
  EXPECT_THAT(Error(query), HasSubstr("no-such-program-xyz"));
}

TEST_F(ResolveProgramTest, NoPythonProgramNotExecutableSaysChmod) {
  ProgramQuery query = Query(Write(At("touch.py"), "", 0644));
  query.no_python = true;
  EXPECT_THAT(Error(query), AllOf(HasSubstr("touch.py"), HasSubstr("not executable")));
}

TEST_F(ResolveProgramTest, BundledProgramIsFoundBesideMusterOffPath) {
  ShellScript(bin() + "/python3");
  const std::string bundled = Elf(self() + "/muster-allreduce");
  const Program program = Resolve(Query("muster-allreduce"));
  EXPECT_EQ(program.path, bundled);
  EXPECT_TRUE(program.no_python);
}

TEST_F(ResolveProgramTest, NativeCommandOnPathWinsOverTheOneBesideMuster) {
  const std::string on_path = Elf(bin() + "/muster-allreduce");
  Elf(self() + "/muster-allreduce");
  EXPECT_EQ(Resolve(Query("muster-allreduce")).path, on_path);
}

TEST_F(ResolveProgramTest, CommandThatIsNoNativeProgramIsNoScriptEither) {
  ShellScript(bin() + "/python3");
  ShellScript(bin() + "/tool");  // a shell script on PATH: not run without --no-python
  EXPECT_THAT(Error(Query("tool")), AllOf(HasSubstr("tool: no such file"),
                                          HasSubstr("-m MODULE, or --no-python PROGRAM")));
}

TEST_F(ResolveProgramTest, MissingScriptIsNamed) {
  ShellScript(bin() + "/python3");
  EXPECT_THAT(Error(Query("/nonexistent/train.py")),
              HasSubstr("/nonexistent/train.py: no such file"));
}

TEST_F(ResolveProgramTest, NativeFileRunsDirectly) {
  const std::string native = Elf(At("a.out"));
  const Program program = Resolve(Query(native));
  EXPECT_EQ(program.path, native);
  EXPECT_TRUE(program.no_python);
}

TEST_F(ResolveProgramTest, NativeFileNotExecutableSaysChmod) {
  const std::string native = Elf(At("a.out"), 0644);
  EXPECT_THAT(Error(Query(native)),
              AllOf(HasSubstr(native), HasSubstr("is a native program but not executable"),
                    HasSubstr("chmod +x")));
}

TEST(IsElfFileTest, OnlyTheMagicCounts) {
  EXPECT_TRUE(IsElfFile("/proc/self/exe"));
  EXPECT_FALSE(IsElfFile("/nonexistent"));
  EXPECT_FALSE(IsElfFile("/proc/self/cmdline"));
}

}  // namespace
}  // namespace muster
