#!/usr/bin/python3
"""What `--accelerate-config` costs against `accelerate launch --config_file`
(issue 34), in Debian sid's PyTorch 2.14 root with accelerate 1.14, in the
same run, alternating the two:

  bench/accelerate_launch.py [--muster PATH] [--runs N]   (as root)

Each launch runs 2 workers of a one-line Python script under the same
MULTI_GPU config (bf16, dynamo); the worker stamps the clock as it starts.
Figures, the median and the range of N runs:
  - the launcher's exec to the last worker started (what `accelerate
    launch` pays before a worker starts: importing torch and accelerate);
  - the launcher's exec to its exit, the workers' run included;
  - the launcher's peak resident memory (its own process: the largest of the
    launch's processes, the workers being one-line scripts).
accelerate launch runs as tests/integration/accelerate_debian.py runs it
(torchrun's store without libuv, which Debian's build lacks).
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

import torch2  # noqa: E402

CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
mixed_precision: bf16
num_machines: 1
num_processes: 2
dynamo_config:
  dynamo_backend: INDUCTOR
"""
WORKER = """\
import time, os
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"start.{os.environ['RANK']}"), "w") as f:
    f.write(repr(time.time()))
"""


def one_launch(launcher, bundle, work):
    """(to the last worker's start, to the launcher's exit), in seconds."""
    for name in os.listdir(work):
        if name.startswith("start."):
            os.remove(os.path.join(work, name))
    if launcher == "muster":
        command = ["/opt/muster/bin/muster", "--accelerate-config", "config.yaml", "worker.py"]
    else:
        command = ["/usr/bin/python3", "accelerate_debian.py", "--config_file", "config.yaml",
                   "worker.py"]
    # The exec of the launcher itself, stamped by the shell that becomes it.
    shell = f"cd {work} && date +%s.%N > t0 && exec {' '.join(command)}"
    result = subprocess.run(torch2.TORCH214.enter_argv(["/bin/sh", "-c", shell], bundle, work),
                            env=torch2.root_env(), capture_output=True, text=True, timeout=300)
    ended = time.time()
    if result.returncode != 0:
        sys.exit(f"{launcher} failed:\n{result.stderr[-3000:]}")
    with open(os.path.join(work, "t0")) as f:
        t0 = float(f.read())
    starts = [float(open(os.path.join(work, f"start.{r}")).read()) for r in range(2)]
    return max(starts) - t0, ended - t0


def peak_rss(launcher, bundle, work):
    """The launcher's peak RSS (MiB), measured alone in a child of its own."""
    code = (f"import resource, subprocess, sys; sys.path.insert(0, {HERE!r}); "
            f"import accelerate_launch as b; b.one_launch({launcher!r}, {bundle!r}, {work!r}); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1]) / 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--muster", default=os.path.join(ROOT, "build", "launcher", "muster"))
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    why = torch2.TORCH214.available()
    if why:
        sys.exit(f"accelerate_launch: {why}")
    os.environ["MUSTER"] = args.muster
    bundle_dir = tempfile.mkdtemp(prefix="muster-bench-")
    work = tempfile.mkdtemp(prefix="muster-bench-work-")
    try:
        bundle = torch2.make_bundle(os.path.join(bundle_dir, "bundle"))
        with open(os.path.join(work, "config.yaml"), "w") as f:
            f.write(CONFIG)
        with open(os.path.join(work, "worker.py"), "w") as f:
            f.write(WORKER)
        for name in ("accelerate_debian.py", "torchrun_debian.py"):
            shutil.copy(os.path.join(ROOT, "tests", "integration", name), work)
        figures = {"muster": [], "accelerate": []}
        one_launch("muster", bundle, work)  # the page cache warm for both
        one_launch("accelerate", bundle, work)
        for _ in range(args.runs):
            for launcher in figures:
                figures[launcher].append(one_launch(launcher, bundle, work))
        rss = {launcher: peak_rss(launcher, bundle, work) for launcher in figures}
        summary = {}
        for launcher, runs in figures.items():
            started = [r[0] for r in runs]
            total = [r[1] for r in runs]
            summary[launcher] = {"to_workers_started_s": statistics.median(started),
                                 "to_workers_started_range": [min(started), max(started)],
                                 "to_exit_s": statistics.median(total),
                                 "to_exit_range": [min(total), max(total)],
                                 "launcher_peak_rss_mib": rss[launcher]}
        for launcher, s in summary.items():
            print(f"{launcher:>10}: workers started {s['to_workers_started_s']:.3f} s "
                  f"({s['to_workers_started_range'][0]:.3f}-{s['to_workers_started_range'][1]:.3f}),"
                  f" exit {s['to_exit_s']:.3f} s, launcher peak RSS "
                  f"{s['launcher_peak_rss_mib']:.0f} MiB")
        m, a = summary["muster"], summary["accelerate"]
        print(f"ratio accelerate/muster: workers started "
              f"{a['to_workers_started_s'] / m['to_workers_started_s']:.1f}x, exit "
              f"{a['to_exit_s'] / m['to_exit_s']:.1f}x, peak RSS "
              f"{a['launcher_peak_rss_mib'] / m['launcher_peak_rss_mib']:.1f}x")
        print(json.dumps({"runs": args.runs, **summary}))
    finally:
        shutil.rmtree(bundle_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
