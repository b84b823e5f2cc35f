"""A worker for the multi-node tests: records its environment, then sleeps.

  record.py DIR [--seconds S] [--fail-rank R] [--fail-times K] [--fail-world N]
            [--slow-stop-rank R --slow-stop-seconds T] [--record-stop]

Writes DIR/env.<restart>.<world>.<rank>.<pid> (JSON of its environment,
written aside and renamed). With --fail-rank, that rank exits 1 in its first
K attempts (K counted by marker files DIR/failed.*), with --fail-world only
those in a world of N ranks. Otherwise it sleeps S
seconds (default 1) and exits 0; SIGTERM ends it at once, but for the rank
of --slow-stop-rank, which takes T seconds to stop.
"""
import argparse
import glob
import json
import os
import signal
import time

parser = argparse.ArgumentParser()
parser.add_argument("dir")
parser.add_argument("--seconds", type=float, default=1.0)
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--fail-times", type=int, default=1)
parser.add_argument("--fail-world", type=int, default=0)
parser.add_argument("--slow-stop-rank", type=int, default=-1)
parser.add_argument("--slow-stop-seconds", type=float, default=0.0)
# Writes stop.RESTART.WORLD.RANK.PID (the time, from time.time()) when SIGTERM
# ends it: when each round's workers stopped, for the test of "no two rounds at once".
parser.add_argument("--record-stop", action="store_true")
args = parser.parse_args()

env = dict(os.environ)
name = "env.{}.{}.{}.{}".format(env["TORCHELASTIC_RESTART_COUNT"], env["WORLD_SIZE"], env["RANK"],
                                os.getpid())
path = os.path.join(args.dir, name)
with open(path + ".tmp", "w") as f:
    json.dump(env, f)
os.replace(path + ".tmp", path)

if int(env["RANK"]) == args.fail_rank and args.fail_world in (0, int(env["WORLD_SIZE"])):
    failed = len(glob.glob(os.path.join(args.dir, "failed.*")))
    if failed < args.fail_times:
        open(os.path.join(args.dir, f"failed.{failed}"), "w").close()
        raise SystemExit(1)
if args.record_stop:
    def record_stop(signum, frame):
        stop = os.path.join(args.dir, "stop." + name.partition(".")[2])
        with open(stop + ".tmp", "w") as f:
            f.write(repr(time.time()))
        os.replace(stop + ".tmp", stop)
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, record_stop)
if int(env["RANK"]) == args.slow_stop_rank:
    def stop_slowly(signum, frame):
        time.sleep(args.slow_stop_seconds)
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, stop_slowly)
time.sleep(args.seconds)
