"""PyTorch's own launcher tests (test/distributed/launcher/test_run.py in
PyTorch main), each case whose effect shows from outside run as a user
would: the same arguments and environment, workers of our own
(workers/suite_worker.py, .sh, elastic_launched.py) doing what the
originals do.

Each launcher runs the whole table under each PyTorch: muster and torchrun
1.13 on this host (Debian's torch), muster and torchrun 2.6 and 2.14 in
the PyTorch 2.x roots (torch2.py). muster must pass every case under each. A torchrun
must pass every case but those its release lacks, listed with why in
TORCHRUN_FAILS; those must fail, so the list stays true. The torchrun
classes test Debian's torch, not muster: labelled "reference", they are
left out of scripts/test (`ctest -L reference` runs them).

Not translated, because they only show inside torchrun's Python:
test_launch_elastic_agent_raise_exception (a mocked agent.run),
test_launch_shutdown (a mocked rendezvous handler), and the mocked halves
of the nproc tests (3 CUDA or XPU devices that are not there); on this
machine `--nproc-per-node gpu` is checked as the error it is without a GPU.
test_virtual_local_rank needs two GPUs (test_torchrun2.VirtualLocalRank
checks what each worker sees)."""
import os
import shutil
import signal
import subprocess
import tempfile
import unittest
import uuid

import torch2
from harness import HERE, MUSTER, PYTHON, TORCHRUN, WORKERS, TempDirTest, env, reserve_port

NPROC = 4
SENTINEL = {"TEST_SENTINEL_PARENT": "FOOBAR"}

# Cases a torchrun release fails, with why. Keys are the test names below.
TORCHRUN_113_FAILS = {
    "test_capture_logs_using_default_logs_specs":
        "1.13 has no log line prefix template: its prefix is [default0]:",
    "test_is_torchelastic_launched_with_logs_spec_defined": "--logs-specs came in 2.3",
    "test_logs_logs_spec_entrypoint_must_be_defined": "--logs-specs came in 2.3",
}
TORCHRUN_26_FAILS = {}
TORCHRUN_214_FAILS = {}


class _Suite:
    """test_run.py's cases. A subclass gives launch_argv, launch_env and FAILS."""

    FAILS = {}
    LAUNCHER = ""

    def setUp(self):
        super().setUp()
        self.touched = self.path("touched")
        os.mkdir(self.touched)
        for name in ("suite_worker.py", "suite_worker.sh", "elastic_launched.py"):
            shutil.copy(os.path.join(WORKERS, name), self.tmp)
        self.script = self.path("suite_worker.py")
        self.shell_script = self.path("suite_worker.sh")

    def start(self, args, extra_env):
        """The launcher with these arguments, in the background."""
        return self._popen(self.launch_argv(self.spell(args)), self.launch_env(extra_env))

    def spell(self, args):
        return args

    def start_python(self, args):
        """This PyTorch's python with these arguments, no launcher."""
        return self._popen(self.python_argv(args), self.launch_env({}))

    def _popen(self, argv, environment):
        out = tempfile.TemporaryFile("w+")
        err = tempfile.TemporaryFile("w+")
        proc = subprocess.Popen(argv, env=environment, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        proc.out, proc.err = out, err
        self.addCleanup(self._end, proc)
        return proc

    @staticmethod
    def _end(proc):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        proc.out.close()
        proc.err.close()

    def finish(self, proc, timeout=120):
        """Waits for proc; returns (exit code, stdout, stderr)."""
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            code = "timed out"
        proc.out.seek(0)
        proc.err.seek(0)
        return code, proc.out.read(), proc.err.read()

    def launch(self, *args, **extra_env):
        result = self.finish(self.start(list(args), extra_env))
        self.runs.append((args, extra_env, result))
        return result

    def outcome(self, passed):
        """Asserts the case's result for this launcher: passed, or failed where
        FAILS says this release cannot pass it."""
        name = self._testMethodName
        runs = "\n".join(f"--- {args} {extra}: exit {code}\nstdout:\n{out[-1500:]}\n"
                         f"stderr:\n{err[-2500:]}" for args, extra, (code, out, err) in self.runs)
        if name in self.FAILS:
            self.assertFalse(passed, f"{self.LAUNCHER} passed {name}, listed as failing "
                             f"({self.FAILS[name]}); update the list\n{runs}")
        else:
            self.assertTrue(passed, f"{self.LAUNCHER} failed {name}\n{runs}")

    def ranks_touched(self):
        return set(os.listdir(self.touched))

    def all_ranks(self, world_size):
        return self.ranks_touched() == {str(i) for i in range(world_size)}

    def rdzv_id(self):
        return str(uuid.uuid4().int)

    def run(self, result=None):
        self.runs = []
        return super().run(result)

    # test_run.py's cases, in its order.

    def test_launch_user_script_python(self):
        code, _, _ = self.launch(
            "--nnodes=1", f"--nproc-per-node={NPROC}", f"--rdzv-id={self.rdzv_id()}",
            "--monitor-interval=1", "--start-method=spawn", self.script,
            f"--touch-file-dir={self.touched}")
        self.outcome(code == 0 and self.all_ranks(NPROC))

    def test_launch_user_script_python_caffe2_bc(self):
        code, _, _ = self.launch(
            "--nnodes=1", f"--nproc-per-node={NPROC}", "--monitor-interval=1",
            "--start-method=spawn", "--master-addr=localhost", f"--master-port={reserve_port()}",
            "--node-rank=0", self.script, f"--touch-file-dir={self.touched}")
        self.outcome(code == 0 and self.all_ranks(NPROC))

    def _no_python(self, *args, **extra_env):
        """test_run.py's bash cases: -m with --no-python is refused before
        anything runs; without -m the shell script runs on every rank."""
        refused, _, _ = self.launch(*args, "--module", self.shell_script, self.touched,
                                    **extra_env)
        refused_cleanly = refused not in (0, "timed out") and not self.ranks_touched()
        code, _, _ = self.launch(*args, self.shell_script, self.touched, **extra_env)
        return refused_cleanly, code

    def test_launch_user_script_bash(self):
        refused, code = self._no_python(
            "--nnodes=1", f"--nproc-per-node={NPROC}", f"--rdzv-id={self.rdzv_id()}",
            "--monitor-interval=1", "--start-method=spawn", "--no-python")
        self.outcome(refused and code == 0 and self.all_ranks(NPROC))

    def test_launch_user_script_default_nproc(self):
        refused, code = self._no_python(
            "--nnodes=1", f"--rdzv-id={self.rdzv_id()}", "--monitor-interval=1",
            "--start-method=spawn", "--no-python")
        self.outcome(refused and code == 0 and self.all_ranks(1))

    def test_launch_with_env_vars(self):
        pet = {"PET_NNODES": "1", "PET_NPROC_PER_NODE": str(NPROC),
               "PET_RDZV_ID": self.rdzv_id(), "PET_MONITOR_INTERVAL": "1",
               "PET_START_METHOD": "spawn", "PET_NO_PYTHON": "1"}
        refused, _, _ = self.launch(self.shell_script, self.touched, PET_MODULE="1", **pet)
        refused_cleanly = refused not in (0, "timed out") and not self.ranks_touched()
        code, _, _ = self.launch(self.shell_script, self.touched, PET_MODULE="0", **pet)
        self.outcome(refused_cleanly and code == 0 and self.all_ranks(NPROC))

    def _nproc(self, nproc):
        # No GPU visible, whatever the machine has: torchrun's test mocks
        # CUDA away, and muster counts GPUs from CUDA_VISIBLE_DEVICES too.
        code, _, _ = self.launch(
            "--nnodes=1", f"--nproc-per-node={nproc}", f"--rdzv-id={self.rdzv_id()}",
            "--monitor-interval=1", "--start-method=spawn", "--no-python", self.shell_script,
            self.touched, CUDA_VISIBLE_DEVICES="")
        return code

    def test_nproc_launch_auto_configurations(self):
        # No GPU visible, so auto is one worker per CPU, as torchrun's test
        # checks with CUDA mocked away. Linux's count, whichever of the two
        # (every CPU, or those this process may run on) the launcher uses.
        code = self._nproc("auto")
        counts = {os.cpu_count(), len(os.sched_getaffinity(0))}
        self.outcome(code == 0 and any(self.all_ranks(n) for n in counts))

    def test_nproc_launch_number_configurations(self):
        code = self._nproc("4")
        self.outcome(code == 0 and self.all_ranks(4))

    def test_nproc_launch_unknown_configurations(self):
        code = self._nproc("unknown")
        self.outcome(code not in (0, "timed out") and not self.ranks_touched())

    def test_nproc_gpu_launch_configurations_without_a_gpu(self):
        # torchrun's test mocks 3 GPUs; with none visible, asking for one
        # worker per GPU is an error (torchrun: "Cuda is not available").
        code = self._nproc("gpu")
        self.outcome(code not in (0, "timed out") and not self.ranks_touched())

    def _elastic(self, *extra, rdzv_conf="--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'"):
        return ["--nnodes=1:2", f"--nproc-per-node={NPROC}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=localhost:{reserve_port()}", rdzv_conf,
                f"--rdzv-id={self.rdzv_id()}", "--monitor-interval=1", *extra,
                "--start-method=spawn", self.script]

    def test_launch_elastic(self):
        code, _, _ = self.launch(*self._elastic(), f"--touch-file-dir={self.touched}")
        self.outcome(code == 0 and self.all_ranks(NPROC))

    def test_launch_elastic_worker_raise_exception(self):
        # torchrun raises ChildFailedError: exit 1, naming the failed worker.
        code, _, err = self.launch(*self._elastic("--max-restarts=0"), "--fail")
        self.outcome(code == 1 and "asked to fail with --fail" in err)

    def test_launch_standalone(self):
        code, _, _ = self.launch(
            "--nnodes=1", f"--nproc-per-node={NPROC}", "--standalone", "--monitor-interval=1",
            "--start-method=spawn", self.script, f"--touch-file-dir={self.touched}")
        self.outcome(code == 0 and self.all_ranks(NPROC))

    def test_launch_run_path(self):
        code, _, _ = self.launch(
            "--run-path", "--nnodes=1", f"--nproc-per-node={NPROC}", "--monitor-interval=1",
            "--start-method=spawn", self.script, f"--touch-file-dir={self.touched}")
        self.outcome(code == 0 and self.all_ranks(NPROC))

    def test_launch_elastic_multiple_agents(self):
        args = self._elastic(rdzv_conf="--rdzv_conf=timeout=5") + [
            f"--touch-file-dir={self.touched}"]
        other = self.start(args, {})
        code, _, _ = self.launch(*args)
        other_code, out, err = self.finish(other)
        self.runs.append((args, {}, (other_code, out, err)))
        self.outcome(code == 0 and other_code == 0 and self.all_ranks(2 * NPROC))

    def test_min_max_nodes_parse(self):
        # launch.parse_min_max_nnodes, seen from the command line: "1" and
        # "2:20" are node counts, "2:20:30" is refused before anything runs.
        code, _, _ = self.launch("--nnodes=2:20:30", "--no-python", self.shell_script,
                                 self.touched)
        self.outcome(code not in (0, "timed out") and not self.ranks_touched())

    def _elastic_launched(self, *extra):
        out_file = self.path("out")
        code, _, _ = self.launch(
            "--run-path", "--nnodes=1", "--nproc-per-node=1", "--monitor-interval=1", *extra,
            self.path("elastic_launched.py"), f"--out-file={out_file}")
        return code == 0 and os.path.exists(out_file) and self.read("out") == "True"

    def test_is_torchelastic_launched(self):
        self.outcome(self._elastic_launched())

    def test_is_torchelastic_launched_with_logs_spec_defined(self):
        self.outcome(self._elastic_launched("--logs_specs=default"))

    def test_logs_logs_spec_entrypoint_must_be_defined(self):
        code, _, err = self.launch(
            "--run-path", "--nnodes=1", "--nproc-per-node=1", "--monitor-interval=1",
            "--logs_specs=DOESNOT_EXIST", self.path("elastic_launched.py"),
            f"--out-file={self.path('out')}")
        # Refused for the name, not as an option this release lacks.
        self.outcome(code not in (0, "timed out") and "DOESNOT_EXIST" in err
                     and "unrecognized arguments" not in err
                     and not os.path.exists(self.path("out")))

    def test_is_not_torchelastic_launched(self):
        # The control: the same script without a launcher says False.
        code, out, err = self.finish(self.start_python(
            [self.path("elastic_launched.py"), f"--out-file={self.path('out')}"]))
        self.runs.append((["python"], {}, (code, out, err)))
        self.outcome(code == 0 and self.read("out") == "False")

    def test_capture_logs_using_default_logs_specs(self):
        code, out, _ = self.launch(
            "--nnodes=1", f"--nproc-per-node={NPROC}", f"--rdzv-id={self.rdzv_id()}",
            "--redirect=3", "--tee=3", "--monitor-interval=1", "--start-method=spawn",
            "--no-python", self.shell_script, self.touched,
            TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[rank${rank}]: ")
        self.outcome(code == 0 and all(f"[rank{i}]: creating " in out for i in range(NPROC)))


class _OnThisHost:
    """PyTorch 1.13: Debian's python3-torch, this host's python. Options
    spelled as 1.13's own test_run.py spelled them (--nproc_per_node):
    torchrun 1.13 has no --nproc-per-node."""

    def spell(self, args):
        spelled = []
        for i, arg in enumerate(args):
            if not arg.startswith("-"):
                return spelled + list(args[i:])
            name, eq, value = arg.partition("=")
            spelled.append("--" + name[2:].replace("-", "_") + eq + value
                           if name.startswith("--") else arg)
        return spelled

    def launch_env(self, extra):
        return env(**SENTINEL, **extra)

    def python_argv(self, args):
        return [PYTHON, *args]


class Muster113(_OnThisHost, _Suite, TempDirTest):
    LAUNCHER = "muster (torch 1.13)"

    def launch_argv(self, args):
        return [MUSTER, *args]


class Torchrun113(_OnThisHost, _Suite, TempDirTest):
    LAUNCHER = "torchrun 1.13"
    FAILS = TORCHRUN_113_FAILS

    def launch_argv(self, args):
        return [PYTHON, TORCHRUN, *args]


class _InTorch2Root(torch2.WithBundle):
    """PyTorch 2.x in its root (a subclass names ROOT); muster as the bundle
    packs it."""

    ROOT = None

    def setUp(self):
        super().setUp()
        shutil.copy(os.path.join(HERE, "torchrun_debian.py"), self.tmp)

    def launch_env(self, extra):
        return torch2.root_env(**SENTINEL, **extra)

    def launch_argv(self, args):
        return self.ROOT.enter_argv(self.argv_in_root(args), self.bundle, self.tmp)

    def python_argv(self, args):
        return self.ROOT.enter_argv(["/usr/bin/python3", *args], self.bundle, self.tmp)


class _Muster:
    def argv_in_root(self, args):
        return ["/opt/muster/bin/muster", *args]


class _Torchrun:
    def argv_in_root(self, args):
        return ["/usr/bin/python3", self.path("torchrun_debian.py"), *args]


@unittest.skipIf(torch2.TORCH26.available(), torch2.TORCH26.available())
class Muster26(_Muster, _InTorch2Root, _Suite, TempDirTest):
    LAUNCHER = "muster (torch 2.6)"
    ROOT = torch2.TORCH26


@unittest.skipIf(torch2.TORCH26.available(), torch2.TORCH26.available())
class Torchrun26(_Torchrun, _InTorch2Root, _Suite, TempDirTest):
    LAUNCHER = "torchrun 2.6"
    ROOT = torch2.TORCH26
    FAILS = TORCHRUN_26_FAILS


@unittest.skipIf(torch2.TORCH214.available(), torch2.TORCH214.available())
class Muster214(_Muster, _InTorch2Root, _Suite, TempDirTest):
    LAUNCHER = "muster (torch 2.14)"
    ROOT = torch2.TORCH214


@unittest.skipIf(torch2.TORCH214.available(), torch2.TORCH214.available())
class Torchrun214(_Torchrun, _InTorch2Root, _Suite, TempDirTest):
    LAUNCHER = "torchrun 2.14"
    ROOT = torch2.TORCH214
    FAILS = TORCHRUN_214_FAILS
