"""A worker that uses PyTorch's file timer (torch.distributed.elastic.timer),
as a script written for torchrun's watchdog does.

  file_timer.py MODE DIR

Every attempt writes DIR/start.<restart>.<rank> ("<pid> <wall time>").
Attempt 0 then, by MODE:
  hang     acquires scope "train_step" for 1 s (recorded in
           DIR/expiry.0.<rank>: "<pid> <expiration time>") and sleeps 30 s
           inside it: the timer server must kill it.
  release  acquires "quick_step" for 1 s, releases it after 0.2 s, then
           sleeps 2 s: a released timer must never be acted on.
  garbage  writes lines that are not the protocol, and a timer for a pid
           that is not a worker, to the pipe, then does what hang does.
Later attempts release a 5 s timer in time and exit 0.
"""
import json
import os
import sys
import time

from torch.distributed.elastic.timer import FileTimerClient, configure, expires

mode, directory = sys.argv[1], sys.argv[2]
rank = os.environ["RANK"]
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
pipe = os.environ["TORCHELASTIC_TIMER_FILE"]
configure(FileTimerClient(pipe))


def record(name, text):
    path = os.path.join(directory, f"{name}.{restart}.{rank}")
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def write_raw(line):
    fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


record("start", f"{os.getpid()} {time.time()}")
if restart > 0:
    with expires(after=5, scope="later_step"):
        time.sleep(0.1)
    sys.exit(0)

if mode == "release":
    with expires(after=1, scope="quick_step"):
        time.sleep(0.2)
    time.sleep(2)
    sys.exit(0)

if mode == "garbage":
    write_raw(b"this is not json\n")
    write_raw(b'{"version": 1, "pid": "x", "scope_id": 1}\n')
    write_raw(b'{"version": 7, "pid": 1, "scope_id": "a", "expiration_time": 1, "signal": 9}\n')
    write_raw(b"[" * 5000 + b"\n")  # not a line a client writes at once: dropped whole
    write_raw(b"\x00\xff\n")
    # Not a worker of this agent: never to be signalled.
    write_raw((json.dumps({"version": 1, "pid": 1, "scope_id": "init", "expiration_time": 1.0,
                           "signal": 9}) + "\n").encode())

deadline = time.time() + 1
record("expiry", f"{os.getpid()} {deadline}")
with expires(after=1, scope="train_step"):
    time.sleep(30)
sys.exit(0)
