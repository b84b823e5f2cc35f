#!/usr/bin/python3
"""What the agent's GPU check costs: its CPU with the check every 1 s and
every 30 s, against the check off, same run, 8 fake GPUs.

  bench/gpu_check_cost.py [--muster PATH] [--nvml PATH] [--seconds 120] [--runs 3]

Each run starts muster --standalone with 8 workers, one per fake GPU
(tests/tools/fake_nvml.cc: each worker's pid is listed on its GPU, the
GPUs busy), for --seconds, once per mode in a new order each run: off
(--gpu-check-interval 0), 30 s, 1 s. The figure is muster's own CPU time
(every thread of the agent's, not its workers', from
/proc/PID/task/*/schedstat, in nanoseconds) from 10 s into the run to 2 s
before its end, the steady state without the start, as a percentage of
one core, the median of --runs; and the check's cost: that minus off's. The fake answers from files, so
a real NVML's calls (ioctls to the driver) may cost more or less per call;
the calls made are the same.
"""
import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GPUS = 8
MODES = {"off": "0", "30 s": "30", "1 s": "1"}

WORKER = """#!/bin/sh
echo "$LOCAL_RANK" > "$FAKE_NVML_DIR/pids/$$"
exec sleep "$RUN_FOR"
"""


def cpu_ns(pid):
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended: its time is gone from the sum either way
    return total


def run_once(muster, nvml, interval, seconds, tmp):
    nvml_dir = tempfile.mkdtemp(dir=tmp)
    os.makedirs(os.path.join(nvml_dir, "pids"))
    with open(os.path.join(nvml_dir, "count"), "w") as f:
        f.write(str(GPUS))
    for gpu in range(GPUS):
        with open(os.path.join(nvml_dir, f"util.{gpu}"), "w") as f:
            f.write("90")
    worker = os.path.join(nvml_dir, "worker.sh")
    with open(worker, "w") as f:
        f.write(WORKER)
    os.chmod(worker, 0o755)
    env = dict(os.environ, MUSTER_NVML_LIBRARY=nvml, FAKE_NVML_DIR=nvml_dir,
               RUN_FOR=str(seconds), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([muster, "--standalone", "--nproc-per-node", str(GPUS),
                             "--gpu-check-interval", interval, "--no-python", worker],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    time.sleep(10)
    first, first_cpu = time.monotonic(), cpu_ns(proc.pid)
    time.sleep(seconds - 12)
    last, last_cpu = time.monotonic(), cpu_ns(proc.pid)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    status = proc.wait()
    if status != 0:
        sys.exit(f"gpu_check_cost: muster failed ({status}):\n{err}")
    if interval != "0" and "GPU check:" in err:
        sys.exit(f"gpu_check_cost: the check warned on a healthy job:\n{err}")
    return 100.0 * (last_cpu - first_cpu) / 1e9 / (last - first)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--muster", default=os.path.join(ROOT, "build", "launcher", "muster"))
    parser.add_argument("--nvml", default=os.path.join(ROOT, "build", "tests", "tools",
                                                       "libnvidia-ml.so.1"))
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.seconds < 20:
        parser.error("--seconds must be 20 or more: 10 s of start, then the steady state")
    figures = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="gpu-check-cost-") as tmp:
        for run in range(args.runs):
            order = list(MODES)
            random.shuffle(order)
            for mode in order:
                figures[mode].append(run_once(args.muster, args.nvml, MODES[mode], args.seconds,
                                              tmp))
                print(f"run {run + 1} {mode:>4}: {figures[mode][-1]:.4f}% of a core",
                      flush=True)
    off = statistics.median(figures["off"])
    print(f"\nmuster's CPU, {GPUS} fake GPUs, 8 workers, {args.seconds:.0f} s runs, "
          f"median of {args.runs}:")
    print(f"{'check':>6} {'% of a core':>12} {'the check':>12}")
    for mode in MODES:
        value = statistics.median(figures[mode])
        extra = "" if mode == "off" else f"{value - off:+.4f}"
        print(f"{mode:>6} {value:12.4f} {extra:>12}")
    print("goal: the check at 30 s within 0.1% of a core")


if __name__ == "__main__":
    main()
