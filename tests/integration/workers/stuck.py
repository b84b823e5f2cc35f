"""A worker that will not stop: it ignores SIGTERM and sleeps, so the agent's
grace runs out and it takes the worker's stacks before SIGKILL. Local rank 0
fails after a second (exit 3), which stops the others.
"""
import os
import signal
import sys
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)


def wait_forever():
    deadline = time.monotonic() + 300  # never outlives a forgotten test
    while time.monotonic() < deadline:
        time.sleep(1)


if os.environ["LOCAL_RANK"] == "0":
    time.sleep(1)
    sys.exit(3)
wait_forever()
