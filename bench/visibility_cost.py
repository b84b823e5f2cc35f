#!/usr/bin/python3
"""What musterd's metrics and event log cost, against neither, same run.

  bench/visibility_cost.py [--musterd PATH] [--scale PATH] [--flood PATH] [--runs 5]
                           [--nodes 10000] [--scrape-every 1]

Modes: off (neither); metrics (--metrics-port 0, scraped with curl every
--scrape-every seconds, far more often than Prometheus' usual 15 s);
event_log (--event-log FILE); both. For each run, each mode in turn (a new order each run), a fresh
musterd takes --nodes simulated nodes of one job (bench/rdzv_scale
--connect: a gRPC channel per node, as agents have): every node joins (an
event per node and one for the round), then a restart round (a worker
failure, every node joins again: two more events). The figures are
musterd's CPU time in each phase (from /proc, as rdzv_scale reads it) and
the wall time to the last assignment, the median of --runs, with the ratio
to off's. musterd's CPU is the cost; the wall time is bound by the 10,000
simulated clients, which share the machine's cores.

Then musterd with both on and --nodes one-node jobs held (tests/tools/rdzv-flood):
how long a scrape takes and how big it is.
"""
import argparse
import collections
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from auth_cost import Musterd, flood, median  # noqa: E402

MODES = ("off", "metrics", "event_log", "both")
JOIN = re.compile(r"^N=\d+ #\d+: join ([\d.]+) ms .*CPU: server (\d+) ms")
RESTART = re.compile(r"restart round: .*last new assignment at ([\d.]+) ms .*CPU: server (\d+) ms")


def metrics_url(server):
    """The URL musterd's start lines named (its stderr file)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(server.err.name) as f:
            for line in f:
                if "metrics: http://" in line:
                    return line.split("metrics: ", 1)[1].split()[0]
        time.sleep(0.05)
    sys.exit("musterd named no metrics URL")


def scrape(url):
    """(seconds, bytes) of one scrape with curl."""
    start = time.monotonic()
    result = subprocess.run(["curl", "-sSf", "--max-time", "30", url], capture_output=True)
    if result.returncode != 0:
        sys.exit(f"curl {url}: {result.stderr.decode()}")
    return time.monotonic() - start, len(result.stdout)


class Scraper:
    """curl every `every` seconds until stopped; counts the scrapes."""

    def __init__(self, url, every):
        self.url, self.every, self.count = url, every, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self):
        while not self.done.wait(self.every):
            scrape(self.url)
            self.count += 1

    def stop(self):
        self.done.set()
        self.thread.join()


def musterd_flags(mode, directory):
    flags = []
    if mode in ("metrics", "both"):
        flags += ["--metrics-port", "0"]
    if mode in ("event_log", "both"):
        log = os.path.join(directory, "events.jsonl")
        if os.path.exists(log):
            os.unlink(log)
        flags += ["--event-log", log]
    return flags


def one_run(args, mode, directory):
    """(join ms, join server CPU ms, restart ms, restart server CPU ms, scrapes)."""
    server = Musterd(args.musterd, musterd_flags(mode, directory), directory)
    scraper = None
    try:
        if mode in ("metrics", "both"):
            scraper = Scraper(metrics_url(server), args.scrape_every)
        result = subprocess.run(
            [args.scale, "--connect", f"127.0.0.1:{server.port}", "--server-pid",
             str(server.proc.pid), "--nodes", str(args.nodes), "--repeat", "1",
             "--heartbeat-seconds", "0", "--restart-round"],
            capture_output=True, text=True, timeout=600)
        join = restart = None
        for line in result.stdout.splitlines():
            join = join or JOIN.search(line)
            restart = restart or RESTART.search(line)
        if result.returncode != 0 or not join or not restart:
            sys.exit(f"rdzv_scale failed: {result.stdout}{result.stderr}")
        scrapes = 0
        if scraper:
            scraper.stop()
            scrapes = scraper.count
        if mode in ("event_log", "both"):
            with open(os.path.join(directory, "events.jsonl")) as f:
                kinds = collections.Counter(json.loads(line)["kind"] for line in f)
            expected = {"node_joined": args.nodes, "round_started": 2, "worker_failed": 1}
            if any(kinds[kind] != count for kind, count in expected.items()):
                sys.exit(f"the event log is not what the run did: {dict(kinds)}")
        return (float(join.group(1)), int(join.group(2)), float(restart.group(1)),
                int(restart.group(2)), scrapes)
    finally:
        if scraper and not scraper.done.is_set():
            scraper.stop()
        server.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--musterd", default=os.path.join(ROOT, "build", "rendezvous", "musterd"))
    parser.add_argument("--scale", default=os.path.join(ROOT, "build", "bench", "rdzv_scale"))
    parser.add_argument("--flood",
                        default=os.path.join(ROOT, "build", "tests", "tools", "rdzv-flood"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--scrape-every", type=float, default=1.0)
    args = parser.parse_args()

    results = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="muster-visibility-") as d:
        order = random.Random(1)
        for _ in range(args.runs):
            # Interleaved, in a new order each run: drift in the machine's
            # load, and whatever the run before leaves behind, fall on all.
            for mode in order.sample(MODES, len(MODES)):
                directory = os.path.join(d, mode)
                os.makedirs(directory, exist_ok=True)
                results[mode].append(one_run(args, mode, directory))

        columns = ["join", "server CPU", "restart round", "server CPU"]
        base = [median([r[i] for r in results["off"]]) for i in range(4)]
        print(f"metrics and event log cost: {args.nodes} simulated nodes join one job, then a "
              f"restart round; median of {args.runs} runs, same run; metrics scraped every "
              f"{args.scrape_every:g} s")
        print("  " + f"{'mode':10}" + "".join(f"{c:>15} {'ratio':>6}" for c in columns))
        for mode in MODES:
            row = [median([r[i] for r in results[mode]]) for i in range(4)]
            print("  " + f"{mode:10}" + "".join(
                f"{value:12.0f} ms {value / base[i] if base[i] else float('nan'):6.2f}"
                for i, value in enumerate(row)))
        # How much one mode's own runs differ: the noise the ratios sit in.
        for mode in MODES:
            spans = [(min(r[i] for r in results[mode]), max(r[i] for r in results[mode]))
                     for i in range(4)]
            print(f"  {mode:10} range: " + ", ".join(
                f"{c} {low:.0f}-{high:.0f} ms" for c, (low, high) in zip(columns, spans)))
        scrapes = sum(r[4] for mode in ("metrics", "both") for r in results[mode])
        print(f"  ({scrapes} scrapes during the metrics runs)")

        directory = os.path.join(d, "held")
        os.makedirs(directory)
        server = Musterd(args.musterd, musterd_flags("both", directory), directory)
        try:
            flood(args.flood, server.port, [], "--jobs", str(args.nodes), "--prefix", "held",
                  "--connections", "8", "--per-connection", "8", "--join-timeout-ms", "600000")
            url = metrics_url(server)
            taken = [scrape(url) for _ in range(5)]
            seconds = median([s for s, _ in taken])
            size = taken[-1][1]
        finally:
            server.stop()
        print(f"  with {args.nodes} one-node jobs held: a scrape takes {seconds * 1000:.1f} ms "
              f"(median of 5) for {size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
