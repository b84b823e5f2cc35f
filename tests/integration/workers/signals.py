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
    # Written aside and renamed, so a reader never sees the file empty.
    path = os.path.join(directory, f"{name}.{rank}")
    with open(path + ".tmp", "w") as f:
        f.write(f"{os.getpid()}\n")
    os.replace(path + ".tmp", path)


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
