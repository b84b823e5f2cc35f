#!/usr/bin/python3
"""Restart latency against the moment of the failure, on loopback.

  bench/restart_sweep.py [--muster PATH] [--runs 3] [--from 0.5] [--to 3.0] [--step 0.1]

bench/multinode.py's restart-latency setup (two agents, --nnodes 2, one
worker each, --max-restarts 1, last_call_timeout=1), with rank 1 failing at
a chosen time after the agents start (its worker sleeps until then). For
each failure time: the median restart latency, from the failing worker's
exit until both workers of the next attempt run, over --runs runs; then the
worst point and its ratio to the median of all points. --log-dir keeps each
run's agent logs (set MUSTER_LOG_LEVEL=debug for more). Every run is
bounded (--run-timeout), and so is the sweep (--budget).

What it found (issue 10): before rendezvous/grpc/callback_ticker.h, a failure
in a 100 ms window 1.0 s after the agents start (and every 1.1 s after)
waited for gRPC's callback threads until that window's end. A step of 0.02
over 0.96-1.2 s shows the window whole; the 0.1 s grid catches its edge.
"""
import argparse
import math
import os
import statistics
import sys
import time

import multinode


def frange(start, stop, step):
    count = int(round((stop - start) / step)) + 1
    return [round(start + i * step, 6) for i in range(count)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--muster",
                        default=os.path.join(multinode.ROOT, "build", "launcher", "muster"))
    parser.add_argument("--runs", type=int, default=3, help="runs per failure time")
    parser.add_argument("--from", dest="start", type=float, default=0.5,
                        help="first failure time, s")
    parser.add_argument("--to", dest="stop", type=float, default=3.0, help="last failure time, s")
    parser.add_argument("--step", type=float, default=0.1, help="s")
    parser.add_argument("--run-timeout", type=float, default=30, help="s, per run")
    parser.add_argument("--budget", type=float, default=900, help="s, the whole sweep")
    parser.add_argument("--log-dir", help="keep agent logs in LOG_DIR/<time>.<run>/")
    args = parser.parse_args()
    if not os.access(args.muster, os.X_OK):
        sys.exit(f"{args.muster}: not built (ninja -C build muster)")

    points = frange(args.start, args.stop, args.step)
    places = max(1, -int(math.floor(math.log10(args.step) + 1e-9)))  # 0.1: 1, 0.02: 2
    deadline = time.monotonic() + args.budget
    medians = {}
    failures = []
    print(f"restart latency by failure time, 2 agents on loopback, median of {args.runs} "
          f"(muster: {args.muster})")
    print(f"{'fail at':>8} {'failed':>8} {'median':>9}   all runs (ms)")
    for at in points:
        latencies, offsets = [], []
        for run in range(args.runs):
            if time.monotonic() > deadline:
                print(f"stopped: the {args.budget:.0f} s budget is spent")
                break
            log_dir = None
            if args.log_dir:
                log_dir = os.path.join(args.log_dir, f"{at:.{places}f}.{run}")
                os.makedirs(log_dir, exist_ok=True)
            try:
                latency, offset = multinode.restart_run("muster", args.muster, fail_after=at,
                                                        log_dir=log_dir, timeout=args.run_timeout)
            except SystemExit as failed:  # the run went wrong: say so, and go on
                failures.append(f"fail at {at:.{places}f} s, run {run}: {failed}")
                print(f"  run failed: {failed}", flush=True)
                continue
            latencies.append(latency)
            offsets.append(offset)
        if not latencies:
            continue
        medians[at] = statistics.median(latencies)
        print(f"{at:7.{places}f}s {statistics.median(offsets):7.3f}s {medians[at]:7.1f}ms   "
              f"{', '.join(f'{x:.1f}' for x in latencies)}", flush=True)
        if time.monotonic() > deadline:
            break

    for failure in failures:
        print(f"failed run: {failure}")
    if not medians:
        sys.exit("no point measured")
    worst = max(medians, key=medians.get)
    typical = statistics.median(medians.values())
    print(f"worst: fail at {worst:.{places}f} s, {medians[worst]:.1f} ms; median of all points "
          f"{typical:.1f} ms (worst / median {medians[worst] / typical:.1f}x)")


if __name__ == "__main__":
    main()
