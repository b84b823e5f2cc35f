#!/usr/bin/python3
"""muster-allreduce's CPU backends against gloo: same ranks, sizes, machine, run.

  bench/allreduce.py [--muster PATH] [--ranks 2,4] [-b 16M] [-e 64M] [-n 10] [-w 3]

Gloo is torch.distributed's all_reduce on a float32 tensor (Debian's
python3-torch, CPU), timed the way muster-allreduce times itself: warm-up
iterations, then the mean of timed ones, in place, averaged over ranks.
Both run under muster --standalone on this machine, one after the other;
muster-allreduce twice: as it picks by itself (shared memory, all ranks on
one machine) and with --backend tcp (the ring, what crosses machines).
busbw = algbw x 2(n-1)/n for both. The target (issue 4): muster at least
2x gloo at 16 MiB and above, for 2 and 4 ranks; judged on the backend
muster picks by itself.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TARGET_RATIO = 2.0

GLOO_WORKER = r'''
import json, os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
sizes, iters, warmup, out = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rows = []
for size in sizes:
    t = torch.ones(size // 4, dtype=torch.float32)
    for _ in range(warmup):
        dist.all_reduce(t)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    us = (time.perf_counter() - start) / iters * 1e6
    times = [None] * world
    dist.all_gather_object(times, us)
    rows.append({"bytes": size, "time_us": sum(times) / world})
if rank == 0:
    with open(out, "w") as f:
        json.dump(rows, f)
dist.destroy_process_group()
'''


def parse_bytes(text):
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1].upper(), 1)
    return int(text[:-1] if scale != 1 else text) * scale


def busbw(size, time_us, ranks):
    return size / (time_us / 1e6) / 1e9 * 2 * (ranks - 1) / ranks


def run(command, env):
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--muster", default=os.path.join(ROOT, "build", "launcher", "muster"))
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("-b", default="16M")
    parser.add_argument("-e", default="64M")
    parser.add_argument("-n", type=int, default=10)
    parser.add_argument("-w", type=int, default=3)
    args = parser.parse_args()
    sizes = []
    size = parse_bytes(args.b)
    while size <= parse_bytes(args.e):
        sizes.append(size)
        size *= 2
    env = dict(os.environ, PYTHON_EXEC="/usr/bin/python3", OMP_NUM_THREADS="1")
    print(f"# muster-allreduce against gloo, float32 sum, in place, {args.w} warm-up and "
          f"{args.n} timed iterations, {os.cpu_count()} cores, "
          f"load {open('/proc/loadavg').read().split()[0]}")
    print(f"# {'ranks':>5} {'size (B)':>10} {'gloo busbw':>11} {'muster, auto':>20} {'ratio':>6}"
          f" {'muster --backend tcp':>20} {'ratio':>6}")
    met = True
    with tempfile.TemporaryDirectory() as tmp:
        worker = os.path.join(tmp, "gloo_worker.py")
        with open(worker, "w") as f:
            f.write(GLOO_WORKER)
        for ranks in [int(r) for r in args.ranks.split(",")]:
            gloo_json = os.path.join(tmp, f"gloo{ranks}.json")
            run([args.muster, "--standalone", "--nproc-per-node", str(ranks), worker,
                 json.dumps(sizes), str(args.n), str(args.w), gloo_json], env)
            ours = {}
            for backend in ("auto", "tcp"):
                muster_json = os.path.join(tmp, f"muster{ranks}{backend}.json")
                run([args.muster, "--standalone", "--nproc-per-node", str(ranks), "muster-allreduce",
                     "-b", args.b, "-e", args.e, "-n", str(args.n), "-w", str(args.w),
                     "--backend", backend, "--json", muster_json], env)
                report = json.load(open(muster_json))
                if any(r["wrong"] or r["inplace"]["wrong"] for r in report["results"]):
                    sys.exit("muster-allreduce reported wrong values")
                ours[backend] = (report["backend"], {r["bytes"]: r for r in report["results"]})
            gloo = {r["bytes"]: r["time_us"] for r in json.load(open(gloo_json))}
            for size in sizes:
                g = busbw(size, gloo[size], ranks)
                auto_name, auto = ours["auto"]
                m = auto[size]["inplace"]["busbw_gbps"]
                t = ours["tcp"][1][size]["inplace"]["busbw_gbps"]
                met = met and m / g >= TARGET_RATIO
                print(f"  {ranks:>5} {size:>10} {g:>6.2f} GB/s {m:>8.2f} GB/s ({auto_name:>4}) "
                      f"{m / g:>5.2f}x {t:>15.2f} GB/s {t / g:>5.2f}x")
    print(f"target: at least {TARGET_RATIO}x gloo at 16 MiB and above: {'met' if met else 'not met'}")


if __name__ == "__main__":
    main()
