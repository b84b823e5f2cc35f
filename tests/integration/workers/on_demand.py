"""A worker that runs until the test tells it how to end.

  on_demand.py DIR

Writes DIR/pid.<restart>.<rank> (its pid; written aside and renamed) as it
starts, then waits: DIR/fail.<rank>.<restart> makes it exit 1, DIR/finish
makes it exit 0. It gives up by itself after 300 s (exit 3), so a test that
forgot it leaves nothing running.
"""
import os
import sys
import time

directory = sys.argv[1]
rank = os.environ["RANK"]
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
path = os.path.join(directory, f"pid.{restart}.{rank}")
with open(path + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(path + ".tmp", path)

fail = os.path.join(directory, f"fail.{rank}.{restart}")
finish = os.path.join(directory, "finish")
deadline = time.monotonic() + 300
while time.monotonic() < deadline:
    if os.path.exists(fail):
        print(f"rank {rank} fails on request (attempt {restart})", file=sys.stderr, flush=True)
        sys.exit(1)
    if os.path.exists(finish):
        sys.exit(0)
    time.sleep(0.05)
sys.exit(3)
