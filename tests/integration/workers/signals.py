"""A worker that records its pid and the signals it gets, for the stop tests.

  signals.py DIR [--ignore-term] [--seconds N]

Writes DIR/pid.<RANK> at start and DIR/<SIGNAME>.<RANK> for each SIGTERM,
SIGINT, SIGUSR1, SIGUSR2 it receives. On SIGTERM or SIGINT it exits 0,
unless --ignore-term, when it goes on. It exits by itself after N seconds (60).
"""
import os
import signal
import sys
import time

directory = sys.argv[1]
ignore_term = "--ignore-term" in sys.argv
seconds = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 60.0
rank = os.environ["RANK"]


def mark(name):
    with open(os.path.join(directory, f"{name}.{rank}"), "a") as f:
        f.write(f"{os.getpid()}\n")


def on_signal(signum, frame):
    name = signal.Signals(signum).name
    mark(name)
    if signum in (signal.SIGTERM, signal.SIGINT) and not ignore_term:
        sys.exit(0)


for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(sig, on_signal)
mark("pid")
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    time.sleep(0.05)
