"""Shared pieces of muster's integration tests: where the binaries are, how
to run them with a bound on time, and small waits that never hang."""
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MUSTER = os.environ.get("MUSTER", os.path.join(ROOT, "build", "launcher", "muster"))
MUSTERD = os.environ.get("MUSTERD", os.path.join(ROOT, "build", "rendezvous", "musterd"))
# An outsider's rendezvous client (tests/tools/rdzv_call.cc).
RDZV_CALL = os.environ.get("RDZV_CALL", os.path.join(ROOT, "build", "tests", "tools", "rdzv-call"))
# Many junk jobs at once (tests/tools/rdzv_flood.cc).
RDZV_FLOOD = os.environ.get("RDZV_FLOOD",
                            os.path.join(ROOT, "build", "tests", "tools", "rdzv-flood"))
TORCHRUN = os.path.join(HERE, "torchrun.py")
PYTHON = "/usr/bin/python3"  # Debian's interpreter, the one with python3-torch
WORKERS = os.path.join(HERE, "workers")
DDP_TRAIN = os.path.join(ROOT, "examples", "ddp_train.py")


# Ports handed out by reserve_port, held until the test's tearDown.
_held_ports = []


def reserve_port():
    """A loopback port for the program under test, held instead of raced for.

    The port stays bound (SO_REUSEADDR, never listening) until the test ends,
    so no other bind to port 0, of this test or one running beside it, is
    handed it; the program can still listen on it, as gRPC, muster-allreduce
    and PyTorch's TCPStore all set SO_REUSEADDR. Connecting to it before the
    program listens is refused, as to a free port."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    _held_ports.append(s)
    return s.getsockname()[1]


def reserve_port_pair():
    """Two loopback ports in a row, both held as reserve_port holds one: for a
    program that listens on the port it is given and on the next one too."""
    for _ in range(100):
        first = socket.socket()
        first.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        first.bind(("127.0.0.1", 0))
        port = first.getsockname()[1]
        second = socket.socket()
        second.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            second.bind(("127.0.0.1", port + 1))
        except OSError:
            first.close()
            second.close()
            continue
        _held_ports.extend([first, second])
        return port
    raise RuntimeError("no two free loopback ports in a row in 100 tries")


def release_ports():
    while _held_ports:
        _held_ports.pop().close()


def env(**extra):
    """The environment a test runs muster with: Debian's python for workers."""
    e = dict(os.environ)
    e["PYTHON_EXEC"] = PYTHON
    e.pop("OMP_NUM_THREADS", None)
    for key in [k for k in e if k.startswith("PET_")]:
        del e[key]
    e.pop("MUSTER_TOKEN_FILE", None)  # a test that wants a token says so
    e.update({k: str(v) for k, v in extra.items()})
    return e


def run(args, timeout=120, **extra_env):
    """Runs a command to its end; returns CompletedProcess with text output."""
    return subprocess.run(args, env=env(**extra_env), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def muster(*args, timeout=120, **extra_env):
    return run([MUSTER, *args], timeout=timeout, **extra_env)


def torchrun(*args, timeout=180, **extra_env):
    return run([PYTHON, TORCHRUN, *args], timeout=timeout, **extra_env)


def read_file(path):
    with open(path) as f:
        return f.read()


def read_env(path):
    """A file of KEY=VALUE lines, as `env` writes it, as a dict."""
    return dict(line.split("=", 1) for line in read_file(path).splitlines() if "=" in line)


def worker_records(directory):
    """What workers/record.py wrote so far: one (restart, world, rank, env) per worker start."""
    out = []
    for path in glob.glob(os.path.join(directory, "env.*")):
        if not path.endswith(".tmp"):
            _, restart, world, rank, _pid = os.path.basename(path).split(".")
            out.append((int(restart), int(world), int(rank), json.loads(read_file(path))))
    return out


def wait_for(predicate, timeout, interval=0.02):
    """Polls predicate until it is true or timeout seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose; it is only waiting for its reaper.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between it and the read
        return False


class TempDirTest(unittest.TestCase):
    """A test with its own temporary directory in self.tmp."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="muster-test-")
        self.tmp = self._tmp.name

    def tearDown(self):
        release_ports()
        self._tmp.cleanup()

    def path(self, name):
        return os.path.join(self.tmp, name)

    def start(self, *args, **extra_env):
        """Starts muster in the background in a new session; the test must end it."""
        out = open(self.path("muster.out"), "w")
        err = open(self.path("muster.err"), "w")
        proc = subprocess.Popen([MUSTER, *args], env=env(**extra_env), stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.addCleanup(self._reap, proc, out, err)
        return proc

    @staticmethod
    def _reap(proc, out, err):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        out.close()
        err.close()

    def read(self, name):
        return read_file(self.path(name))


class OnDemandWorkers:
    """For a test whose workers are workers/on_demand.py, writing to
    self.work: which attempts started, with which pids, and how to end them.
    The test gives self.work and a self.logs() for its failure messages."""

    ON_DEMAND = os.path.join(WORKERS, "on_demand.py")

    def pids(self, attempt, ranks=2):
        """The workers' pids of `attempt` once every rank has written one."""
        paths = [os.path.join(self.work, f"pid.{attempt}.{r}") for r in range(ranks)]
        started = wait_for(lambda: all(os.path.exists(p) for p in paths), timeout=60)
        self.assertTrue(started, f"attempt {attempt} did not start:\n{self.logs()}")
        return {r: int(read_file(p)) for r, p in enumerate(paths)}

    def fail_rank(self, rank, attempt):
        """Rank `rank` of attempt `attempt` exits 1."""
        open(os.path.join(self.work, f"fail.{rank}.{attempt}"), "w").close()

    def finish_workers(self):
        """Every worker exits 0."""
        open(os.path.join(self.work, "finish"), "w").close()

    def attempts(self):
        """The attempts (restart counts) whose workers started."""
        return sorted({int(os.path.basename(p).split(".")[1])
                       for p in glob.glob(os.path.join(self.work, "pid.*"))
                       if not p.endswith(".tmp")})


if __name__ == "__main__":
    sys.exit("run the test modules, not this file")
