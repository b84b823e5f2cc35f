#!/usr/bin/python3
"""muster-allreduce's NCCL backend against nccl-tests: same GPUs, sizes, run.

  bench/nccl_tests.py --all-reduce-perf PATH [--muster PATH] [-b 8] [-e 1G]
                      [-f 2] [-n 20] [-w 5] [--repeat 2]

nccl-tests' all_reduce_perf (built with MPI=0: one process, one thread per
GPU, -g GPUS) and muster-allreduce --backend nccl under muster --standalone
(one process per GPU) run one after the other, --repeat times each,
alternating, with the same sizes, warm-up and timed iterations, float sum.
Both time themselves the same way: the mean of the timed iterations. For
each size the least time of the repeats is kept, for each tool, out of
place and in place; the ratio is nccl-tests' time over muster's (above 1:
muster is faster). Needs a machine with NVIDIA GPUs: scripts/gpu-check's
bundle and a build of https://github.com/NVIDIA/nccl-tests.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(command):
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.stdout.write(done.stdout)
        sys.exit(f"nccl_tests.py: {' '.join(command)} exited {done.returncode}")
    return done.stdout


def parse_nccl_tests(text):
    """Rows of all_reduce_perf's table: {bytes: (out-of-place us, in-place us)}."""
    rows = {}
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#") or not fields[0].isdigit() or len(fields) < 9:
            continue
        # ... time algbw busbw #wrong time algbw busbw #wrong: the last eight.
        rows[int(fields[0])] = (float(fields[-8]), float(fields[-4]))
    if not rows:
        sys.exit("nccl_tests.py: all_reduce_perf printed no table:\n" + text)
    return rows


def parse_muster(path):
    with open(path) as f:
        report = json.load(f)
    if report["backend"] != "nccl":
        sys.exit(f"nccl_tests.py: muster-allreduce ran on {report['backend']}, not nccl")
    rows = {r["bytes"]: (r["time_us"], r["inplace"]["time_us"]) for r in report["results"]}
    return rows, report["world_size"]


def least(runs):
    best = {}
    for rows in runs:
        for size, times in rows.items():
            old = best.get(size, (float("inf"), float("inf")))
            best[size] = (min(old[0], times[0]), min(old[1], times[1]))
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all-reduce-perf", required=True, help="nccl-tests' all_reduce_perf")
    parser.add_argument("--muster", default=os.path.join(ROOT, "build", "launcher", "muster"))
    parser.add_argument("-b", default="8")
    parser.add_argument("-e", default="1G")
    parser.add_argument("-f", default="2")
    parser.add_argument("-n", default="20")
    parser.add_argument("-w", default="5")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()

    sizes = ["-b", args.b, "-e", args.e, "-f", args.f, "-n", args.n, "-w", args.w]
    muster_runs, nccl_runs = [], []
    world = None
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            report = os.path.join(tmp, f"muster-{i}.json")
            run([args.muster, "--standalone", "--nproc-per-node", "gpu", "muster-allreduce",
                 *sizes, "-d", "float", "--backend", "nccl", "--json", report])
            rows, world = parse_muster(report)
            muster_runs.append(rows)
            nccl_runs.append(parse_nccl_tests(run(
                [args.all_reduce_perf, *sizes, "-g", str(world), "-d", "float", "-o", "sum"])))
    muster, nccl = least(muster_runs), least(nccl_runs)

    print(f"# all-reduce, float sum, {world} GPU(s), least of {args.repeat} runs each, "
          f"{args.w} warm-up and {args.n} timed iterations")
    print(f"# {'size (B)':>12} {'muster us':>10} {'nccl-tests us':>13} {'ratio':>6}"
          f" {'in-place muster':>15} {'nccl-tests':>10} {'ratio':>6}")
    figures = []
    for size in sorted(set(muster) & set(nccl)):
        (m, mi), (n, ni) = muster[size], nccl[size]
        figures.append({"bytes": size, "muster_us": m, "nccl_tests_us": n,
                        "inplace_muster_us": mi, "inplace_nccl_tests_us": ni})
        print(f"  {size:>12} {m:>10.2f} {n:>13.2f} {n / m:>6.2f} {mi:>15.2f} {ni:>10.2f} {ni / mi:>6.2f}")
    if not figures:
        sys.exit("nccl_tests.py: the two tools share no size")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"world_size": world, "repeat": args.repeat, "results": figures}, f, indent=1)


if __name__ == "__main__":
    main()
