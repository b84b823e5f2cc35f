#!/usr/bin/python3
"""Launch time and agent memory: muster against torchrun, same machine, same run.

  bench/launch.py [--muster PATH] [--runs N] [--nproc 8]

Launch: wall time of `LAUNCHER --standalone --nproc-per-node 8 --no-python
/bin/true`, from exec to exit, median of N runs; torchrun with
--monitor_interval 0.1 and with its default (5 s in 1.13).
Memory: the agent's peak RSS (VmHWM) with 8 workers running (`sleep`), read
from /proc while they run.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TORCHRUN = ["/usr/bin/python3", os.path.join(ROOT, "tests", "integration", "torchrun.py")]


def environment():
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # no notice line in either launcher
    return env


def time_launch(command, runs):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env=environment(), timeout=120)
        times.append(time.perf_counter() - start)
        if result.returncode != 0:
            sys.exit(f"{command} failed: {result.stderr.decode()[-2000:]}")
    return statistics.median(times), min(times)


def status_kb(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return None


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def peak_rss(command, nproc, seconds=3):
    """Runs `command` (a launcher whose workers sleep `seconds`); returns the
    agent's VmHWM (KiB) read once all nproc workers run, and how many
    workers were seen."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=environment())
    hwm, seen = None, 0
    deadline = time.monotonic() + seconds + 30
    while proc.poll() is None and time.monotonic() < deadline:
        seen = max(seen, len(children(proc.pid)))
        value = status_kb(proc.pid, "VmHWM")
        if value is not None and seen >= nproc:
            hwm = value
        time.sleep(0.05)
    proc.wait(timeout=60)
    return hwm, seen


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--muster", default=os.path.join(ROOT, "build", "launcher", "muster"))
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--torchrun-runs", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=8)
    args = parser.parse_args()
    n = str(args.nproc)

    muster = [args.muster, "--standalone", "--nproc-per-node", n]
    torch_fast = TORCHRUN + ["--standalone", "--nproc_per_node", n, "--monitor_interval", "0.1"]
    torch_default = TORCHRUN + ["--standalone", "--nproc_per_node", n]

    print(f"launch: --standalone --nproc-per-node {n} --no-python /bin/true "
          f"(median of {args.runs} muster runs, {args.torchrun_runs} torchrun runs)")
    m, m_min = time_launch(muster + ["--no-python", "/bin/true"], args.runs)
    tf, _ = time_launch(torch_fast + ["--no_python", "/bin/true"], args.torchrun_runs)
    td, _ = time_launch(torch_default + ["--no_python", "/bin/true"], args.torchrun_runs)
    print(f"  muster                          {m * 1000:8.1f} ms  (min {m_min * 1000:.1f} ms)")
    print(f"  torchrun --monitor_interval 0.1 {tf * 1000:8.1f} ms  ratio {tf / m:6.1f}x")
    print(f"  torchrun (default interval)     {td * 1000:8.1f} ms  ratio {td / m:6.1f}x")

    print(f"memory: agent peak RSS (VmHWM) with {n} workers running")
    mh, mseen = peak_rss(muster + ["--no-python", "sleep", "3"], args.nproc)
    th, tseen = peak_rss(torch_fast + ["--no_python", "sleep", "3"], args.nproc)
    if mh is None or th is None:
        sys.exit(f"could not read peak RSS (workers seen: muster {mseen}, torchrun {tseen})")
    print(f"  muster    {mh / 1024:7.1f} MiB")
    print(f"  torchrun  {th / 1024:7.1f} MiB  ratio {th / mh:6.1f}x")


if __name__ == "__main__":
    main()
