#!/usr/bin/python3
"""What musterd's metrics and event log cost, against neither, same run.

  bench/visibility_cost.py [--musterd PATH] [--flood PATH] [--runs 5] [--joins 10000]
                           [--scrape-every 1]

Modes: off (neither); metrics (--metrics-port 0, scraped with curl every
--scrape-every seconds while the joins run, far more often than the 15 s
Prometheus scrapes at by default); event_log (--event-log FILE); both.
For each run, each mode in turn, a fresh musterd takes --joins one-node
jobs (each a join, a round formed: two events) from tests/tools/rdzv-flood:
  - one after the other on one connection (the latency a join sees);
  - 64 at a time over 8 connections (what the server's CPU allows).
Figures: joins/s, the median of --runs, with the ratio to off's. Then, with
--joins jobs held, how long one scrape takes and how big it is, and the
event log's line count (two per job, checked).
"""
import argparse
import os
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


def one_run(args, mode, directory, run, shape):
    server = Musterd(args.musterd, musterd_flags(mode, directory), directory)
    scraper = None
    try:
        if mode in ("metrics", "both"):
            scraper = Scraper(metrics_url(server), args.scrape_every)
        seconds = flood(args.flood, server.port, [], "--jobs", str(args.joins), "--prefix",
                        f"run{run}", *shape)
        if scraper:
            scraper.stop()
        return args.joins / seconds
    finally:
        if scraper and not scraper.done.is_set():
            scraper.stop()
        server.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--musterd", default=os.path.join(ROOT, "build", "rendezvous", "musterd"))
    parser.add_argument("--flood",
                        default=os.path.join(ROOT, "build", "tests", "tools", "rdzv-flood"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--joins", type=int, default=10000)
    parser.add_argument("--scrape-every", type=float, default=1.0)
    args = parser.parse_args()

    shapes = {"sequential": ["--per-connection", "1"],
              "concurrent": ["--connections", "8", "--per-connection", "8"]}
    rates = {(mode, shape): [] for mode in MODES for shape in shapes}
    with tempfile.TemporaryDirectory(prefix="muster-visibility-") as d:
        for run in range(args.runs):
            # Modes interleaved, so drift in the machine's load falls on all.
            for shape, flags in shapes.items():
                for mode in MODES:
                    directory = os.path.join(d, mode)
                    os.makedirs(directory, exist_ok=True)
                    rates[(mode, shape)].append(one_run(args, mode, directory, run, flags))

        print(f"metrics and event log cost, {args.joins} joins, median of {args.runs} runs, "
              f"same run (metrics scraped every {args.scrape_every:g} s)")
        print(f"  {'mode':10} {'sequential':>13} {'ratio':>6} {'concurrent':>13} {'ratio':>6}")
        for mode in MODES:
            row = [median(rates[(mode, shape)]) for shape in shapes]
            base = [median(rates[("off", shape)]) for shape in shapes]
            print(f"  {mode:10} {row[0]:10.0f} /s {row[0] / base[0]:6.2f} "
                  f"{row[1]:10.0f} /s {row[1] / base[1]:6.2f}")

        directory = os.path.join(d, "held")
        os.makedirs(directory)
        server = Musterd(args.musterd, musterd_flags("both", directory), directory)
        try:
            flood(args.flood, server.port, [], "--jobs", str(args.joins), "--prefix", "held",
                  *shapes["concurrent"])
            url = metrics_url(server)
            scrapes = [scrape(url) for _ in range(5)]
            seconds = median([s for s, _ in scrapes])
            size = scrapes[-1][1]
            rss = server.rss_mib()
        finally:
            server.stop()
        with open(os.path.join(directory, "events.jsonl")) as f:
            lines = sum(1 for _ in f)
        print(f"  with {args.joins} jobs held: a scrape takes {seconds * 1000:.1f} ms "
              f"(median of 5) for {size / 1024:.0f} KiB; musterd RSS {rss:.1f} MiB; "
              f"event log {lines} lines")
        if lines != 2 * args.joins:
            sys.exit(f"the event log has {lines} lines, not {2 * args.joins}")


if __name__ == "__main__":
    main()
