"""A worker that reports its steps in MUSTER_PROGRESS_FILE, as a training
loop would, and fails or finishes as the test asks.

  progress.py stuck DIR          fails at step 0 every time: no step written
  progress.py advance DIR        writes steps 10*R+1 .. 10*R+5 (R: the restart
                                 count), then fails: new steps every round
  progress.py bad-host HOST DIR  on host HOST, fails 0.3 s in; elsewhere
                                 writes a step every 50 ms until DIR/finish
                                 exists (at most 60 s), then exits 0

Each start writes DIR/start.<host>.<restart>.<rank>; a good worker that
finishes writes DIR/done.<host>.<restart>.<rank>.
"""
import os
import socket
import sys
import time

mode, directory = sys.argv[1], sys.argv[-1]
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank = os.environ["RANK"]
host = socket.gethostname()
progress = os.environ["MUSTER_PROGRESS_FILE"]


def mark(kind):
    open(os.path.join(directory, f"{kind}.{host}.{restart}.{rank}"), "w").close()


def write_step(step):
    with open(progress, "w") as f:
        f.write(f"{step} {step * 32}\n")


mark("start")
if mode == "stuck":
    time.sleep(0.1)
    sys.exit(1)
if mode == "advance":
    for step in range(10 * restart + 1, 10 * restart + 6):
        write_step(step)
        time.sleep(0.02)
    time.sleep(0.1)
    sys.exit(1)
if mode == "bad-host":
    if host == sys.argv[2]:
        time.sleep(0.3)
        sys.exit(1)
    step = 0
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(directory, "finish")) and time.monotonic() < deadline:
        step += 1
        write_step(step)
        time.sleep(0.05)
    mark("done")
    sys.exit(0)
sys.exit(f"unknown mode {mode}")
