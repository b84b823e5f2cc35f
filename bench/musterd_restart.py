#!/usr/bin/python3
"""How long agents take to find a restarted musterd: real agents, real musterd.

  bench/musterd_restart.py [--agents 16] [--runs 5] [--down 3]

Each run: musterd --state-dir DIR on a reserved loopback port; N agents
(--nnodes N, one worker each, is_host=0, default keep-alive settings) join
it; once every worker runs (and 1 s more, for every watch stream to open),
musterd is SIGKILLed, and --down seconds later started again on the same
port and DIR. The figure: from that start (its Popen) until every agent has
logged "the rendezvous at ... answers again". Also printed: when the new
musterd said it serves, the outage the agents reported, and how many came
back how many whole seconds after the kill. Checks that every agent said
"does not answer" once, that no worker was restarted (the same pids, all
alive, no second attempt), and that the job then finishes (every worker
ends 0, every agent exits 0).

Workers are /bin/sh: each writes its pids, then blocks reading a FIFO until
the bench ends the job (under `timeout`, so none outlives a bench that
died). Agents' stderr lines are timestamped as they arrive, through a pipe.
"""
import argparse
import contextlib
import glob
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Writes DIR/pid.<restart>.<rank> (aside, then renamed): the pid of the
# agent's worker (`timeout`) and its own; then waits for a line on
# DIR/finish (a FIFO) and exits 0.
WORKER = r'''
d=$1
echo $PPID $$ > $d/pid.$TORCHELASTIC_RESTART_COUNT.$RANK.tmp
mv $d/pid.$TORCHELASTIC_RESTART_COUNT.$RANK.tmp $d/pid.$TORCHELASTIC_RESTART_COUNT.$RANK
read line < $d/finish
'''
SERVING = re.compile(r"musterd: serving rendezvous on (\S+):(\d+)$")
ANSWERS = re.compile(r"the rendezvous at \S+ answers again, after ([0-9.]+) s away")
GONE = "does not answer"


@contextlib.contextmanager
def reserved_port():
    """As bench/multinode.py: bound (SO_REUSEADDR, never listening) for the
    whole run, so no other bind to port 0 is handed it while musterd is
    down; musterd can still listen on it (gRPC sets SO_REUSEADDR too)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


class Lines:
    """A child's output, each line stamped (time.monotonic()) as it arrives,
    and copied to a log file."""

    def __init__(self, stream, log_path):
        self.lines = []  # (t, text)
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, args=(stream, log_path), daemon=True)
        self.thread.start()

    def _read(self, stream, log_path):
        with open(log_path, "w") as log:
            for raw in stream:
                t = time.monotonic()
                text = raw.decode(errors="replace").rstrip("\n")
                with self.lock:
                    self.lines.append((t, text))
                log.write(f"{t:.6f} {text}\n")
                log.flush()

    def find(self, pattern, since=0.0):
        """(t, match) of the first line at or after `since` that matches; None if none."""
        with self.lock:
            lines = list(self.lines)
        for t, text in lines:
            if t >= since:
                m = re.search(pattern, text)
                if m:
                    return t, m
        return None

    def count(self, text):
        with self.lock:
            return sum(text in line for _, line in self.lines)


def wait_for(predicate, timeout, step=0.005):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()


class Musterd:
    def __init__(self, musterd, port, state, log_dir, name):
        with open(os.path.join(log_dir, f"{name}.err"), "wb") as err:
            self.started = time.monotonic()
            self.proc = subprocess.Popen(
                [musterd, "--listen", "127.0.0.1", "--port", str(port), "--state-dir", state],
                stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL)
        self.out = Lines(self.proc.stdout, os.path.join(log_dir, f"{name}.out"))

    def serving(self, timeout=15):
        found = wait_for(lambda: self.out.find(SERVING) or self.proc.poll() is not None, timeout)
        if found is True or not found:
            sys.exit(f"musterd did not serve (exit {self.proc.poll()})")
        return found[0]

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def pids(directory):
    out = {}
    for path in glob.glob(os.path.join(directory, "pid.*")):
        if path.endswith(".tmp"):
            continue
        _, attempt, rank = os.path.basename(path).split(".")
        with open(path) as f:
            out[(int(attempt), int(rank))] = tuple(int(p) for p in f.read().split())
    return out


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def release(work, count):
    """Writes a line for each of `count` workers to WORK/finish; whether any
    worker was reading it (non-blocking: with none, it does not wait)."""
    try:
        fifo = os.open(os.path.join(work, "finish"), os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: no reader
        return False
    try:
        os.write(fifo, b"\n" * count)
    finally:
        os.close(fifo)
    return True


def one_run(args, run):
    """One kill and restart: returns a dict of figures (seconds)."""
    with tempfile.TemporaryDirectory(prefix="muster-bench-") as d, reserved_port() as port:
        work = os.path.join(d, "work")
        state = os.path.join(d, "state")
        # Apart from d, so that a failed run's logs outlive it.
        logs = tempfile.mkdtemp(prefix=f"musterd-restart-{run}-")
        os.makedirs(work)
        os.mkfifo(os.path.join(work, "finish"))
        musterd = Musterd(args.musterd, port, state, logs, "musterd1")
        agents, outs = [], []
        try:
            musterd.serving()
            env = dict(os.environ, OMP_NUM_THREADS="1")
            command = [args.muster, "--rdzv-backend", "c10d", "--rdzv-endpoint",
                       f"127.0.0.1:{port}", "--rdzv-id", "restart-bench", "--nnodes",
                       str(args.agents), "--nproc-per-node", "1", "--rdzv-conf", "is_host=0",
                       "--no-python", "timeout", "300", "sh", "-c", WORKER, "worker", work]
            for i in range(args.agents):
                p = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
                agents.append(p)
                outs.append(Lines(p.stderr, os.path.join(logs, f"agent{i}.err")))
            if not wait_for(lambda: len(pids(work)) == args.agents, 60, step=0.05):
                sys.exit(f"run {run}: {len(pids(work))} of {args.agents} workers started; "
                         f"logs in {logs}")
            before = pids(work)
            time.sleep(1)  # every agent's watch stream open

            musterd.stop(signal.SIGKILL)
            killed = time.monotonic()
            time.sleep(args.down)
            musterd = Musterd(args.musterd, port, state, logs, "musterd2")
            started = musterd.started
            serving = musterd.serving()

            def answered():
                found = [out.find(ANSWERS, since=started) for out in outs]
                return found if all(found) else None

            found = wait_for(answered, args.timeout)
            if not found:
                missing = [i for i, out in enumerate(outs)
                           if not out.find(ANSWERS, since=started)]
                sys.exit(f"run {run}: agents {missing} never said the rendezvous answers again "
                         f"within {args.timeout} s; logs in {logs}")
            times = [t - started for t, _ in found]
            away = [float(m.group(1)) for _, m in found]
            gone = [out.count(GONE) for out in outs]
            if gone != [1] * args.agents:
                sys.exit(f"run {run}: 'does not answer' said {gone} times by the agents, want "
                         f"once each; logs in {logs}")
            after = pids(work)
            dead = [key for key, both in before.items() if not all(alive(p) for p in both)]
            if after != before or dead:
                sys.exit(f"run {run}: workers changed: before {before}, after {after}, dead "
                         f"{dead}; logs in {logs}")

            # End the job: every worker exits 0, every agent then 0.
            if not release(work, args.agents):
                sys.exit(f"run {run}: no worker waits on the FIFO; logs in {logs}")
            codes = []
            for p in agents:
                try:
                    codes.append(p.wait(timeout=30))
                except subprocess.TimeoutExpired:
                    codes.append(None)
            if codes != [0] * args.agents:
                sys.exit(f"run {run}: agents exited {codes}; logs in {logs}")
            if args.keep_logs:
                print(f"run {run}: logs in {logs}")
            else:
                shutil.rmtree(logs)
            # When each agent came back, counted from the kill: an agent retries
            # its watch on whole seconds from there.
            after_kill = {}
            for t, _ in found:
                second = round(t - killed)
                after_kill[second] = after_kill.get(second, 0) + 1
            return {"first": min(times), "last": max(times), "serving": serving - started,
                    "away_min": min(away), "away_max": max(away),
                    "down": started - killed, "after_kill": after_kill}
        finally:
            for p in agents:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            musterd.stop()
            # Workers still waiting (a run that failed) are released through
            # their FIFO, not killed by pid: a pid may be another's by now.
            # `timeout` ends any that this misses within 300 s.
            release(work, args.agents)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--muster", default=os.path.join(ROOT, "build", "launcher", "muster"))
    parser.add_argument("--musterd", default=os.path.join(ROOT, "build", "rendezvous", "musterd"))
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--down", type=float, default=3.0,
                        help="seconds between the SIGKILL and the new start")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds the agents may take to find the new musterd")
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep each run's logs (path printed) even when it passed")
    args = parser.parse_args()

    print(f"musterd --state-dir, {args.agents} agents (is_host=0, one /bin/sh worker each, "
          f"default keep-alive), on loopback; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; SIGKILL once every worker runs, "
          f"start again {args.down:g} s later on the same port and state directory")
    results = []
    for run in range(1, args.runs + 1):
        r = one_run(args, run)
        results.append(r)
        print(f"run {run}: new musterd serving {r['serving'] * 1000:.0f} ms after its start; "
              f"agents said it answers again {r['first'] * 1000:.0f}–{r['last'] * 1000:.0f} ms "
              f"after its start (outage they reported: {r['away_min']:.1f}–{r['away_max']:.1f} "
              f"s; kill to start {r['down']:.2f} s; agents back at "
              f"{', '.join(f'{k} s x{v}' for k, v in sorted(r['after_kill'].items()))} after "
              f"the kill); workers unchanged, job finished", flush=True)
    last = sorted(r["last"] * 1000 for r in results)
    serving = sorted(r["serving"] * 1000 for r in results)
    print(f"from the new musterd's start until all {args.agents} agents answer again: median "
          f"{statistics.median(last):.0f} ms (range {last[0]:.0f}–{last[-1]:.0f}, {args.runs} "
          f"runs); until it serves: median {statistics.median(serving):.0f} ms")


if __name__ == "__main__":
    main()
