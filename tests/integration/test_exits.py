#!/usr/bin/python3
"""Every way muster, musterd and musterctl end, over and over (issue 30).

An agent that exits after its job ended must say how the job ended, every
time: a gRPC object freed on one of gRPC's threads while the process goes
down made 5 in 8,000 agent exits die of a double free (134 in a release
build), which Slurm reads as a failed job. A race of 1 in 1,000 shows only in
thousands of exits, so this runs each exit path many times, K agents at a
time against one musterd, and checks each process's exit code against the
documented one, and (under the sanitizers) that no process left a report.

The paths, with the exit codes they must give:
  success      every worker exits 0                         agents 0
  failure      every worker exits 1, no restart left         agents 1
  closed       rank 0's worker fails, the others run on:     agents 1
               the job is closed by another node
  stop         `musterctl stop` while the workers run        agents 1, musterctl 0
  sigterm      SIGTERM to every agent while the workers run  agents 143 (128 + 15)
  gone         musterd stopped (SIGTERM or SIGINT, in turn)  agents 0, musterd 0
               while the workers run; they finish, and the
               agents give up telling it after join_timeout
  unreachable  no rendezvous at all: the join times out      agents 1,
                                                             musterctl status 1
Standalone agents (--standalone: the rendezvous in-process, no gRPC at all),
K at a time, each a job of 2 workers, the paths whose code is the agent's
own, for TSan, which cannot see into Debian's uninstrumented gRPC:
  success      both workers exit 0                          0
  restart      both fail once, then succeed (1 restart)     0
  failure      both exit 1, no restart left                 1
  killed       a worker dies of SIGKILL, no restart left    1
  sigterm      SIGTERM to the agent while the workers run   143
Beside the batches that stop or lose a running job, `musterctl status` (0
while it runs) and `musterctl watch` (1: the job was stopped, or the watch
cut by musterd's end); after the batches, the shared musterd gets SIGTERM (0).

ctest runs a short form (test_exits.ExitPaths, test_exits.Standalone). The
long form, for docs/BENCHMARKS.md:
  tests/integration/test_exits.py --exits 20000 --agents 50 [--paths success,stop]
  tests/integration/test_exits.py --standalone --exits 20000 --agents 20
with MUSTER, MUSTERD and MUSTERCTL naming the binaries (a sanitized tree's),
and the sanitizers' log_path under --sanitizer-logs DIR: any report there
fails the run."""
import argparse
import glob
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from harness import MUSTER, env, read_file, release_ports, reserve_port, wait_for
from test_musterd import MUSTERD, SERVING
from test_visibility import MUSTERCTL

PATHS = ("success", "failure", "closed", "stop", "sigterm", "gone", "unreachable")
# Longest a batch may take before it is counted as hung (and killed): a hang
# is a failure of its own.
BATCH_TIMEOUT = 180
# What a worker does: `{dir}` is the batch's directory, where each worker
# writes a file named for its rank once it runs.
RUNNING = "echo running > {dir}/w.$RANK.tmp && mv {dir}/w.$RANK.tmp {dir}/w.$RANK; "
GO = "while [ ! -e {dir}/go ]; do sleep 0.05; done"  # until the test says go
WORKERS = {
    "success": "exit 0",
    "failure": "exit 1",
    "closed": RUNNING + '[ "$RANK" != 0 ] && exec sleep 120; ' + GO + "; exit 1",
    "stop": RUNNING + "exec sleep 120",
    "sigterm": RUNNING + "exec sleep 120",
    "gone": RUNNING + GO,
    "unreachable": "exit 0",
}
AGENT_CODE = {"success": 0, "failure": 1, "closed": 1, "stop": 1, "sigterm": 128 + signal.SIGTERM,
              "gone": 0, "unreachable": 1}
STANDALONE_PATHS = ("success", "restart", "failure", "killed", "sigterm")
STANDALONE_WORKERS = {
    "success": "exit 0",
    "restart": '[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && exit 1; exit 0',
    "failure": "exit 1",
    # The shell is the worker; its child sends the signal.
    "killed": "[ \"$LOCAL_RANK\" = 1 ] && sh -c 'kill -KILL $PPID'; exec sleep 120",
    "sigterm": RUNNING + "exec sleep 120",
}
STANDALONE_CODE = {"success": 0, "restart": 0, "failure": 1, "killed": 1,
                   "sigterm": 128 + signal.SIGTERM}
# join_timeout of the paths that wait for it to run out.
GIVE_UP_S = {"gone": 8, "unreachable": 2}


class Process:
    """A program run in the background in a session of its own, its output in files."""

    def __init__(self, directory, name, argv, **extra_env):
        self.name = name
        self.program = {MUSTER: "muster", MUSTERD: "musterd", MUSTERCTL: "musterctl"}[argv[0]]
        self.out_path = os.path.join(directory, name + ".out")
        self.err_path = os.path.join(directory, name + ".err")
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(argv, env=env(**extra_env), stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def wait(self, deadline):
        """The exit code, or None if it still ran at `deadline` (time.monotonic)."""
        try:
            return self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return None

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)

    def err(self, tail=1500):
        return read_file(self.err_path)[-tail:]


class Musterd(Process):
    def __init__(self, directory, name="musterd"):
        super().__init__(directory, name, [MUSTERD, "--listen", "127.0.0.1", "--port", "0"])
        wait_for(lambda: SERVING.search(read_file(self.out_path)) or self.proc.poll() is not None,
                 timeout=30)
        match = SERVING.search(read_file(self.out_path))
        if not match:
            self.kill()
            raise RuntimeError(f"musterd did not start: {self.err()}")
        self.endpoint = f"127.0.0.1:{match.group(2)}"


class Run:
    """Batches of agents on each path, with what went wrong in each."""

    def __init__(self, directory, agents, log=print):
        self.dir = directory
        self.agents = agents
        self.log = log
        self.exits = {"muster": 0, "musterd": 0, "musterctl": 0}
        self.wrong = []  # (what, expected code, code, its stderr's end)
        self.musterd = None
        self.batch = 0

    def check(self, process, expected, code):
        self.exits[process.program] += 1
        if code != expected:
            self.wrong.append((f"batch {self.batch}: {process.name}", expected, code,
                               process.err()))

    def ctl(self, expected, what, *args):
        """Runs musterctl to its end and checks its exit code."""
        result = subprocess.run([MUSTERCTL, *args], env=env(), capture_output=True, text=True,
                                timeout=60, stdin=subprocess.DEVNULL)
        self.exits["musterctl"] += 1
        if result.returncode != expected:
            self.wrong.append((f"batch {self.batch}: musterctl {what}", expected,
                               result.returncode, result.stderr[-1500:]))

    @staticmethod
    def go(work):
        with open(os.path.join(work, "go"), "w"):
            pass

    def run_batch(self, path):
        self.batch += 1
        work = os.path.join(self.dir, f"b{self.batch}")
        os.makedirs(work)
        own_musterd = None
        if path == "gone":
            own_musterd = Musterd(work)
            endpoint = own_musterd.endpoint
        elif path == "unreachable":
            endpoint = f"127.0.0.1:{reserve_port()}"  # bound, never listening: refused
        else:
            if self.musterd is None:
                self.musterd = Musterd(self.dir)
            endpoint = self.musterd.endpoint
        job = f"j{self.batch}"
        conf = "is_host=0"
        if path in GIVE_UP_S:
            conf += f",join_timeout={GIVE_UP_S[path]}"
        agents = [Process(work, f"a{n}", [
            MUSTER, "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", job,
            "--nnodes", str(self.agents), "--nproc-per-node", "1", "--max-restarts", "0",
            "--rdzv-conf", conf, "--no-python", "sh", "-c", WORKERS[path].format(dir=work)])
                  for n in range(self.agents)]
        deadline = time.monotonic() + BATCH_TIMEOUT
        watch = None
        try:
            if path in ("closed", "stop", "sigterm", "gone"):
                everyone = lambda: len(glob.glob(os.path.join(work, "w.[0-9]*"))) == self.agents
                if not wait_for(everyone, timeout=BATCH_TIMEOUT / 2, interval=0.05):
                    raise TimeoutError("the workers did not all start")
                if path == "closed":
                    self.go(work)
                else:
                    self.ctl(0, "status", "status", "--endpoint", endpoint, job)
            if path in ("stop", "gone"):
                watch = Process(work, "watch", [MUSTERCTL, "watch", "--endpoint", endpoint, job])
                # The watch is open once it printed the job's state.
                wait_for(lambda: os.path.getsize(watch.out_path) > 0 or
                         watch.proc.poll() is not None, timeout=30)
            if path == "stop":
                self.ctl(0, "stop", "stop", "--endpoint", endpoint, job, "--reason", "exit test")
            elif path == "sigterm":
                for agent in agents:
                    agent.proc.send_signal(signal.SIGTERM)
            elif path == "gone":
                own_musterd.proc.send_signal(signal.SIGTERM if self.batch % 2 else signal.SIGINT)
                self.check(own_musterd, 0, own_musterd.wait(deadline))
                self.go(work)
            elif path == "unreachable":
                self.ctl(1, "status (no rendezvous)", "status", "--endpoint", endpoint,
                         "--timeout", "1", job)
            for agent in agents:
                self.check(agent, AGENT_CODE[path], agent.wait(deadline))
            if watch is not None:
                # Cut by musterd's end, or the job failed: 1.
                self.check(watch, 1, watch.wait(deadline))
        except TimeoutError as e:
            self.wrong.append((f"batch {self.batch} ({path})", "-", "timeout", str(e)))
        finally:
            for p in agents + [p for p in (watch, own_musterd) if p is not None]:
                p.kill()
            release_ports()

    def run_standalone_batch(self, path):
        """K standalone agents at once, each its own job of 2 workers."""
        self.batch += 1
        work = os.path.join(self.dir, f"b{self.batch}")
        agents, dirs = [], []
        for n in range(self.agents):
            own = os.path.join(work, str(n))
            os.makedirs(own)
            dirs.append(own)
            agents.append(Process(own, f"a{n}", [
                MUSTER, "--standalone", "--nproc-per-node", "2",
                "--max-restarts", "1" if path == "restart" else "0",
                "--no-python", "sh", "-c", STANDALONE_WORKERS[path].format(dir=own)]))
        deadline = time.monotonic() + BATCH_TIMEOUT
        try:
            if path == "sigterm":
                for agent, own in zip(agents, dirs):
                    started = lambda: len(glob.glob(os.path.join(own, "w.[0-9]"))) == 2
                    if not wait_for(started, timeout=BATCH_TIMEOUT / 2, interval=0.05):
                        raise TimeoutError(f"{agent.name}'s workers did not both start")
                    agent.proc.send_signal(signal.SIGTERM)
            for agent in agents:
                self.check(agent, STANDALONE_CODE[path], agent.wait(deadline))
        except TimeoutError as e:
            self.wrong.append((f"batch {self.batch} ({path})", "-", "timeout", str(e)))
        finally:
            for agent in agents:
                agent.kill()

    def finish(self):
        if self.musterd is not None:
            self.musterd.proc.send_signal(signal.SIGTERM)
            self.check(self.musterd, 0, self.musterd.wait(time.monotonic() + 60))
            self.musterd.kill()
            self.musterd = None


def sanitizer_reports(directory):
    return sorted(glob.glob(os.path.join(directory, "*"))) if directory else []


def long_form(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exits", type=int, default=2000,
                        help="agent exits to make in all (default 2000)")
    parser.add_argument("--agents", type=int, default=50, help="agents a batch (default 50)")
    parser.add_argument("--standalone", action="store_true",
                        help="standalone agents, no gRPC (for TSan)")
    parser.add_argument("--paths", default="",
                        help=f"comma-separated, from {','.join(PATHS)} (with --standalone, "
                             f"{','.join(STANDALONE_PATHS)}); default all")
    parser.add_argument("--sanitizer-logs", default="",
                        help="where the sanitizers write their reports (log_path's directory)")
    args = parser.parse_args(argv)
    known = STANDALONE_PATHS if args.standalone else PATHS
    paths = args.paths.split(",") if args.paths else list(known)
    if unknown := [p for p in paths if p not in known]:
        parser.error(f"unknown path {', '.join(unknown)}; the paths are {', '.join(known)}")
    if args.agents < 2 or args.exits < args.agents:
        parser.error("--agents must be 2 or more, and --exits at least --agents")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="muster-exits-") as directory:
        run = Run(directory, args.agents)
        counts = {p: 0 for p in paths}
        try:
            for path in itertools.cycle(paths):
                if run.exits["muster"] >= args.exits:
                    break
                if args.standalone:
                    run.run_standalone_batch(path)
                else:
                    run.run_batch(path)
                counts[path] += 1
                if run.batch % 20 == 0:
                    print(f"{run.batch} batches, {run.exits['muster']} agent exits, "
                          f"{len(run.wrong)} wrong, {time.monotonic() - started:.0f} s",
                          flush=True)
        finally:
            run.finish()
    reports = sanitizer_reports(args.sanitizer_logs)
    for what, expected, code, err in run.wrong[:20]:
        print(f"WRONG {what}: exit {code}, documented {expected}\n{err}", file=sys.stderr)
    for report in reports[:5]:
        print(f"--- {report}\n{read_file(report)}", file=sys.stderr)
    print(f"exits: {run.exits['muster']} muster{' (standalone)' if args.standalone else ''}, "
          f"{run.exits['musterd']} musterd, "
          f"{run.exits['musterctl']} musterctl, in {run.batch} batches of {args.agents} agents "
          f"({', '.join(f'{p} {n}' for p, n in counts.items())}), "
          f"{time.monotonic() - started:.0f} s")
    print(f"{len(run.wrong)} wrong exit code(s), {len(reports)} sanitizer report(s)")
    return 0 if not run.wrong and not reports else 1


class ExitPaths(unittest.TestCase):
    """The short form: each path twice, 6 agents a batch, every exit code as documented.
    Sanitizer reports are scripts/test --sanitize's to find (<tree>/sanitizer-logs)."""

    def test_every_exit_code_as_documented(self):
        with tempfile.TemporaryDirectory(prefix="muster-exits-") as directory:
            run = Run(directory, agents=6)
            try:
                for path in PATHS * 2:
                    with self.subTest(path=path, batch=run.batch + 1):
                        before = len(run.wrong)
                        run.run_batch(path)
                        self.assertEqual(run.wrong[before:], [])
            finally:
                run.finish()
            self.assertEqual(run.wrong, [])
            self.assertEqual(run.exits["muster"], 6 * 2 * len(PATHS))


class Standalone(unittest.TestCase):
    """The short form of the standalone paths: each three times, 4 agents a batch
    (scripts/test --sanitize runs it under TSan too)."""

    def test_every_exit_code_as_documented(self):
        with tempfile.TemporaryDirectory(prefix="muster-exits-") as directory:
            run = Run(directory, agents=4)
            for path in STANDALONE_PATHS * 3:
                with self.subTest(path=path, batch=run.batch + 1):
                    before = len(run.wrong)
                    run.run_standalone_batch(path)
                    self.assertEqual(run.wrong[before:], [])
            self.assertEqual(run.wrong, [])
            self.assertEqual(run.exits["muster"], 4 * 3 * len(STANDALONE_PATHS))


if __name__ == "__main__":
    sys.exit(long_form(sys.argv[1:]))
