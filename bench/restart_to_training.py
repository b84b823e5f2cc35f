#!/usr/bin/python3
"""What a user waits for after a failure, and at the first launch: muster
cold, muster --preload torch, and torchrun, in the same run (issue 33).

  bench/restart_to_training.py [--muster PATH] [--runs N] [--nproc 2]

Each worker stamps the clock as its script starts (before `import torch`),
after `import torch`, and once init_process_group (gloo) and a barrier are
done: "in training". Rank 1 of the first attempt then exits 1. Figures, the
median and the range of N runs, alternating the launchers:
  - failure to the new workers started (the first stamp of attempt 1);
  - failure to every rank back in training (the last barrier of attempt 1);
  - first launch (the launcher's exec) to every rank in training;
  - how many workers imported torch themselves (the others had it preloaded);
  - memory once attempt 1 trains: the proportional set size (PSS) of every
    worker and of the preloaded interpreter, summed: what the node pays.
torchrun is tests/integration/torchrun.py with --monitor_interval 0.1.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PYTHON = "/usr/bin/python3"
TORCHRUN = [PYTHON, os.path.join(ROOT, "tests", "integration", "torchrun.py"),
            "--monitor_interval", "0.1"]

WORKER = textwrap.dedent('''\
    import time
    started = time.time()
    import sys
    preloaded = "torch" in sys.modules
    import json, os
    import torch
    import torch.distributed as dist
    imported = time.time()
    rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo")
    dist.barrier()
    training = time.time()
    record = {"started": started, "imported": imported, "training": training,
              "preloaded": preloaded}

    def pss(pid):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                return {l.split()[0][:-1]: int(l.split()[1]) for l in f if l.split()[0] in
                        ("Rss:", "Pss:")}
        except OSError:
            return None

    if attempt == 1:
        time.sleep(0.3)  # every rank trains: what the node holds now
        record["memory"] = pss(os.getpid())
        if rank == 0:  # the agent's other children: the preloaded interpreter
            agent = os.getppid()
            for task in os.listdir(f"/proc/{agent}/task"):
                with open(f"/proc/{agent}/task/{task}/children") as f:
                    for pid in f.read().split():
                        with open(f"/proc/{pid}/cmdline", "rb") as c:
                            if b"muster_preload.py" in c.read():
                                record["interpreter"] = pss(pid)
        dist.barrier()
    if rank == 1 and attempt == 0:
        record["failed"] = time.time()
    with open(os.path.join(sys.argv[1], f"{rank}.{attempt}.json"), "w") as f:
        json.dump(record, f)
    if rank == 1 and attempt == 0:
        os._exit(1)
    if attempt == 0:
        time.sleep(30)  # stopped by the launcher once rank 1 failed
''')


def run_once(command, work, nproc):
    os.makedirs(work)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHON_EXEC=PYTHON)
    launched = time.time()
    result = subprocess.run([*command, "--standalone", "--nproc_per_node", str(nproc),
                             "--max_restarts", "1", os.path.join(work, "..", "worker.py"), work],
                            capture_output=True, text=True, env=env, timeout=300)
    if result.returncode != 0:
        sys.exit(f"{command} failed:\n{result.stderr[-3000:]}")
    records = {}
    for name in os.listdir(work):
        rank, attempt, _ = name.split(".")
        with open(os.path.join(work, name)) as f:
            records[int(rank), int(attempt)] = json.load(f)
    failed = records[1, 0]["failed"]
    again = [records[r, 1] for r in range(nproc)]
    first = [records[r, 0] for r in range(nproc)]
    memory = sum(r["memory"]["Pss"] for r in again)
    interpreter = records[0, 1].get("interpreter")
    return {
        "started": min(r["started"] for r in again) - failed,
        "training": max(r["training"] for r in again) - failed,
        "first": max(r["training"] for r in first) - launched,
        "imports": sum(not r["preloaded"] for r in (*again, *first)),
        "pss_mib": (memory + (interpreter["Pss"] if interpreter else 0)) / 1024,
        "interpreter_rss_mib": interpreter["Rss"] / 1024 if interpreter else 0,
    }


def summary(values, unit="s", digits=2):
    return (f"{statistics.median(values):.{digits}f} {unit} "
            f"({min(values):.{digits}f}-{max(values):.{digits}f})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--muster", default=os.path.join(ROOT, "build", "launcher", "muster"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--skip-torchrun", action="store_true")
    args = parser.parse_args()
    launchers = {"muster cold": [args.muster], "muster --preload torch":
                 [args.muster, "--preload", "torch"]}
    if not args.skip_torchrun:
        launchers["torchrun"] = TORCHRUN
    figures = {name: [] for name in launchers}
    with tempfile.TemporaryDirectory(prefix="restart-bench-") as tmp:
        with open(os.path.join(tmp, "worker.py"), "w") as f:
            f.write(WORKER)
        for n in range(args.runs):
            for name, command in launchers.items():
                work = os.path.join(tmp, f"{name.replace(' ', '_')}.{n}")
                figures[name].append(run_once(command, work, args.nproc))
    print(f"{args.nproc} ranks, gloo, {args.runs} runs each; median (min-max)")
    header = ("launcher", "failure->started", "failure->training", "first launch->training",
              "torch imports", "PSS of the node", "preloaded RSS")
    print(" | ".join(header))
    base = statistics.median(r["training"] for r in figures["muster cold"])
    for name, runs in figures.items():
        pick = lambda key: [r[key] for r in runs]
        print(" | ".join((name, summary(pick("started"), "s", 3), summary(pick("training")),
                          summary(pick("first")), f"{statistics.median(pick('imports')):.0f}",
                          summary(pick("pss_mib"), "MiB", 0),
                          summary(pick("interpreter_rss_mib"), "MiB", 0))))
    for name, runs in figures.items():
        median = statistics.median(r["training"] for r in runs)
        print(f"failure->training, {name}: {median / base:.2f}x muster cold")


if __name__ == "__main__":
    main()
