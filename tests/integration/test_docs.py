"""The docs name only options that exist, and their links lead somewhere.

README.md and every docs/*.md are read as a user reads them. Each
`--long-option` a command line in them gives to one of muster's programs
(muster, musterd, musterctl and its subcommands, muster-allreduce) must be in
that program's --help: in a code block, or in inline code, a command that
starts with the program (after environment assignments, sudo, srun and its
options, torchrun's --no_python, a `$ ` prompt; lines continued with a
backslash are one command) names that program's options, up to the script
for muster, whose arguments are the script's. A command of one of the
repository's own tools (bench/, tests/tools/, tests/integration/test_exits.py,
scripts/) names options its source defines. Any other `--option` in the text
(prose, a table, an option quoted alone) must be one of those, or another
tool's that OTHER_TOOLS names with its tool. Relative links must reach a file,
and a #fragment a heading of it."""
import glob
import os
import re
import shlex
import subprocess
import unittest

from harness import MUSTER, MUSTERD, ROOT

MUSTERCTL = os.environ.get("MUSTERCTL", os.path.join(ROOT, "build", "ctl", "musterctl"))
ALLREDUCE = os.environ.get("ALLREDUCE", os.path.join(ROOT, "build", "launcher", "muster-allreduce"))
BINARIES = {"muster": MUSTER, "musterd": MUSTERD, "musterctl": MUSTERCTL,
            "muster-allreduce": ALLREDUCE}
SUBCOMMANDS = ("status", "watch", "stop", "health")

# Options of other tools that the docs name, each with its tool. An option
# of muster's own programs never belongs here: a name missing from their
# --help is a mistake in the docs (or a missing option), not another tool's.
OTHER_TOOLS = {
    # sbatch, srun, scancel (Slurm)
    "--nodes": "sbatch/srun",
    "--gres": "sbatch",
    "--ntasks-per-node": "srun",
    "--gpus-per-task": "srun",
    "--signal": "sbatch/scancel",
    "--wait": "sbatch",
    "--requeue": "sbatch",
    # the training scripts of the examples (examples/ddp_train.py, train.py)
    "--lr": "train.py (the user's script)",
    "--epochs": "examples/ddp_train.py",
    # build, test and install tools
    "--install": "cmake",
    "--build": "cmake",
    "--prefix": "cmake --install",
    "--target": "cmake --build",
    "--output-on-failure": "ctest",
    "--user": "curl",
    "--now": "systemctl",
    "--max-request-bytes": "etcd",
    # Hugging Face accelerate's launcher, which --accelerate-config stands in for
    "--config_file": "accelerate launch",
    # installing without root
    "--strip-components": "tar",
    "--no-index": "pip install",
}

# Placeholders the docs use for any option ("as `--opt value` or `--opt=value`").
PLACEHOLDERS = ("--opt",)

# The repository's own tools that the docs run (benchmarks, test tools, the
# scripts), by the name they are run as: rdzv_scale (build/bench/rdzv_scale),
# rdzv-flood (tests/tools/rdzv_flood.cc), bench/launch.py, test_exits.py,
# muster_simulator (tests/sim/muster_simulator.cc), scripts/test. An option of theirs is one their source spells: "--repeat"
# in a string, or a shell case pattern `  --sanitize)`.
TOOL_SOURCES = ("bench/*.py", "bench/*.cc", "tests/tools/*.cc", "tests/integration/test_exits.py",
                "tests/sim/muster_simulator.cc", "scripts/*")
SOURCE_OPTION = re.compile(r"""(?:(?<=["'])|^\s*)(--[A-Za-z][\w-]*)(?=["'=,|)\s]|$)""", re.M)

# Abbreviations the docs show on purpose (argparse's rule, which muster
# follows): each must be the start of muster options, one (unambiguous) or
# several (ambiguous, an error).
ABBREVIATIONS = {"--redirect": ["--redirects"], "--nproc": ["--nproc-per-node"],
                 "--rdzv": ["--rdzv-backend", "--rdzv-conf", "--rdzv-endpoint", "--rdzv-id"]}

# A line of --help that defines an option: "  -r, --redirects 0-3|...   text",
# "  -b,--minbytes TEXT=8   text", "  --munge Excludes: --token-file".
HELP_OPTION = re.compile(r"^ {1,8}(?:(-\w),\s?)?(--\w[\w-]*)(?: (\S+))?(?: |$)")
NOT_A_VALUE = ("Excludes:", "Needs:", "REQUIRED")
LONG_OPTION = re.compile(r"^--[A-Za-z][\w-]*")
BARE_OPTION = re.compile(r"(?<![\w`/-])--[A-Za-z][\w-]*")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SEPARATOR = re.compile(r"^[();<>|&]+$")


class Help:
    """One program's options, from its --help: long and short, each with
    whether it takes a value."""

    def __init__(self, program, argv):
        out = subprocess.run(argv + ["--help"], capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL)
        if out.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} --help exited {out.returncode}: {out.stderr}")
        self.program = program
        self.takes_value = {}
        for line in out.stdout.splitlines():
            m = HELP_OPTION.match(line)
            if not m:
                continue
            short, long_, metavar = m.groups()
            value = metavar is not None and metavar not in NOT_A_VALUE
            self.takes_value[long_] = value
            if short:
                self.takes_value[short] = value
        if not self.takes_value:
            raise AssertionError(f"no option found in {' '.join(argv)} --help")

    def name(self, option):
        """The option as the program knows it, or None. muster takes every
        option with underscores too (--nproc_per_node)."""
        option = option.split("=", 1)[0]
        if option in self.takes_value:
            return option
        if self.program == "muster" and option.replace("_", "-") in self.takes_value:
            return option.replace("_", "-")
        return None


def markdown_files():
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def split_markdown(path):
    """(line number, 'code' or 'text', text): a code block's commands, each
    with its continuation lines joined, and every other line as it is."""
    with open(path) as f:
        lines = f.read().split("\n")
    in_code = False
    pending, pending_line = "", 0
    for number, line in enumerate(lines, 1):
        if FENCE.match(line):
            in_code = not in_code
            continue
        if not in_code:
            yield number, "text", line
            continue
        if not pending:
            pending_line = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield pending_line, "code", pending + line
        pending = ""


def tokens(command):
    """Shell words of one command line, separators (| && ; ( ) < >) as their
    own words; a line that is not shell (an unbalanced quote) split on spaces."""
    command = re.sub(r"^\s*\$ ", "", command).replace("`", " ; ")
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        return list(lexer)
    except ValueError:
        return command.split()


def tool_key(word):
    word = ASSIGNMENT.sub("", word)
    name = os.path.basename(word)
    return (name[:-3] if name.endswith(".py") else name).replace("-", "_")


def repo_tools():
    """{name as run, '-' as '_': (source path, the options it spells)}."""
    tools = {}
    for pattern in TOOL_SOURCES:
        for path in sorted(glob.glob(os.path.join(ROOT, pattern))):
            if not os.path.isfile(path):
                continue
            base = os.path.basename(path)
            key = (os.path.splitext(base)[0] if base.endswith((".py", ".cc")) else base)
            with open(path, errors="replace") as f:
                tools[key.replace("-", "_")] = (os.path.relpath(path, ROOT),
                                                set(SOURCE_OPTION.findall(f.read())))
    return tools


def program_of(word):
    """The muster program a word runs (muster, /usr/local/bin/musterd,
    ExecStart=/usr/local/bin/musterd), or None."""
    word = ASSIGNMENT.sub("", word)
    name = os.path.basename(word)
    return name if name in BINARIES else None


class Docs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.helps = {name: Help(name, [path]) for name, path in BINARIES.items()}
        for sub in SUBCOMMANDS:
            cls.helps[f"musterctl {sub}"] = Help("musterctl", [MUSTERCTL, sub])
        cls.tools = repo_tools()
        cls.tool_options = set().union(*(options for _, options in cls.tools.values()))

    def tool_of(self, word):
        """The repository's tool a word runs (build/bench/rdzv_scale,
        bench/launch.py, rdzv-flood, test_exits.py, scripts/test), or None: a
        bare name counts only for a benchmark or test tool's binary or a
        Python file, so that a plain word (`test`) is not taken for one."""
        key = tool_key(word)
        if key not in self.tools:
            return None
        source = self.tools[key][0]
        if "/" in word or word.endswith(".py") or source.endswith(".cc"):
            return key
        return None

    def setUp(self):
        self.problems = []

    def where(self, path, line):
        return f"{os.path.relpath(path, ROOT)}:{line}"

    # -- options --------------------------------------------------------------

    def check_foreign(self, path, line, option):
        """An option no command line gives to a program of muster's: one of
        theirs, or another tool's that OTHER_TOOLS names."""
        option = option.split("=", 1)[0]
        if option in OTHER_TOOLS or option in ABBREVIATIONS or option in PLACEHOLDERS:
            return
        if any(h.name(option) for h in self.helps.values()) or option in self.tool_options:
            return
        self.problems.append(
            f"{self.where(path, line)}: {option} is in the --help of none of muster's programs "
            f"(muster, musterd, musterctl, muster-allreduce) nor in the source of the "
            f"repository's tools; if it is another tool's, add it to OTHER_TOOLS in "
            f"tests/integration/test_docs.py with the tool")

    def check_tool_words(self, path, line, key, words):
        source, options = self.tools[key]
        for word in words:
            option = word.split("=", 1)[0]
            if LONG_OPTION.match(option) and option not in options:
                self.problems.append(f"{self.where(path, line)}: {key} has no option {option} "
                                     f"(not in {source})")

    def check_own(self, path, line, program, option):
        if self.helps[program].name(option) is None:
            self.problems.append(
                f"{self.where(path, line)}: {program} has no option {option.split('=', 1)[0]} "
                f"(not in `{program} --help`)")

    def check_program_words(self, path, line, program, words):
        """The words after a program's name, to the end of its command."""
        if program == "musterctl":
            helper = "musterctl"
            for word in words:
                if word in SUBCOMMANDS and helper == "musterctl":
                    helper = f"musterctl {word}"
                elif LONG_OPTION.match(word):
                    self.check_own(path, line, helper, word)
            return
        if program != "muster":
            for word in words:
                if LONG_OPTION.match(word):
                    self.check_own(path, line, program, word)
            return
        # muster: its options, then the script, whose arguments are its own.
        help_ = self.helps["muster"]
        i = 0
        while i < len(words):
            word = words[i]
            if word == "...":
                i += 1
            elif word.startswith("-") and word != "-":
                if word.startswith("--"):
                    self.check_own(path, line, "muster", word)
                known = help_.name(word)
                i += 2 if known and "=" not in word and help_.takes_value[known] else 1
            else:
                rest = words[i + 1:]
                inner = program_of(word)
                if inner:
                    self.check_program_words(path, line, inner, rest)
                else:
                    for arg in rest:
                        if LONG_OPTION.match(arg):
                            self.check_foreign(path, line, arg)
                return

    def check_command(self, path, line, command):
        segment = []
        for word in tokens(command) + [";"]:
            if not SEPARATOR.match(word):
                segment.append(word)
                continue
            for i, w in enumerate(segment):
                program = program_of(w)
                if program:
                    self.check_program_words(path, line, program, segment[i + 1:])
                    break
                tool = self.tool_of(w)
                if tool:
                    self.check_tool_words(path, line, tool, segment[i + 1:])
                    break
                if LONG_OPTION.match(w):
                    self.check_foreign(path, line, w)
            segment = []

    def test_every_option_named_exists(self):
        files = markdown_files()
        self.assertIn(os.path.join(ROOT, "docs", "launching.md"), files)
        for path in files:
            for line, kind, text in split_markdown(path):
                if kind == "code":
                    self.check_command(path, line, text)
                    continue
                for m in INLINE_CODE.finditer(text):
                    self.check_command(path, line, m.group(2))
                for option in BARE_OPTION.findall(INLINE_CODE.sub(" ", text)):
                    self.check_foreign(path, line, option)
        self.assertEqual(self.problems, [], "options the docs name that do not exist:\n  "
                         + "\n  ".join(self.problems))

    def test_abbreviations_are_what_the_docs_say(self):
        options = sorted(o for o in self.helps["muster"].takes_value if o.startswith("--"))
        for abbreviation, meant in ABBREVIATIONS.items():
            self.assertEqual([o for o in options if o.startswith(abbreviation)], meant,
                             f"{abbreviation} abbreviates another set of muster's options now")

    def test_other_tools_are_not_ours(self):
        for option, tool in OTHER_TOOLS.items():
            owners = [name for name, h in self.helps.items() if h.name(option)]
            self.assertEqual(owners, [], f"{option} is listed as {tool}'s, but {owners} take it: "
                             f"drop it from OTHER_TOOLS so the docs are checked against them")

    # -- links ----------------------------------------------------------------

    @staticmethod
    def anchors(path):
        """The #fragments of a Markdown file's headings, as GitHub makes them."""
        seen = {}
        result = set()
        for _, kind, text in split_markdown(path):
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", text) if kind == "text" else None
            if not m:
                continue
            slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            result.add(slug if n == 0 else f"{slug}-{n}")
        return result

    def test_links_lead_somewhere(self):
        for path in markdown_files():
            for line, kind, text in split_markdown(path):
                if kind == "code":
                    continue
                for target in LINK.findall(INLINE_CODE.sub(" ", text)):
                    if re.match(r"^[a-z]+:", target):
                        continue  # http:, https:, mailto:
                    file_part, _, fragment = target.partition("#")
                    linked = (os.path.normpath(os.path.join(os.path.dirname(path), file_part))
                              if file_part else path)
                    if not os.path.exists(linked):
                        self.problems.append(f"{self.where(path, line)}: {target}: no such file")
                    elif fragment and linked.endswith(".md") and fragment not in self.anchors(linked):
                        self.problems.append(
                            f"{self.where(path, line)}: {target}: no heading #{fragment} in "
                            f"{os.path.relpath(linked, ROOT)}")
        self.assertEqual(self.problems, [], "links that lead nowhere:\n  "
                         + "\n  ".join(self.problems))


if __name__ == "__main__":
    unittest.main()
