#!/usr/bin/python3
"""From a bad node's failure to training again on the spare, on loopback.

  bench/bad_node.py [--runs 5] [--muster PATH] [--musterd PATH]

musterd and three agents, each on a host of its own (a UTS namespace:
unshare -u, so root), --nnodes 2, one shell worker each. The worker on
nodeA fails at every start; those on nodeB and nodeC write their start
time and then "train" (sleep) until the run ends. Two modes, the same
failure:

  excluded   --max-node-failures 1: nodeA is excluded at its first failure,
             the spare nodeC takes its seat (what issue 32 adds)
  restart    --max-node-failures 0: the same failure restarts the job on
             nodeA and nodeB, as without exclusion (what it is compared with;
             nodeA then fails again, which is not timed)

Each run times, from the moment nodeA's worker wrote that it fails (just
before its exit), until every worker of the next round has started: the
user's "every rank training again". Detection costs nothing here (an exit
is seen at once through SIGCHLD), so the excluded time is all muster's
beyond detection: the goal is 1 s or less. Prints each mode's median, min
and max, and the ratio of the medians. Every run is bounded (--run-timeout).
"""
import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVING = re.compile(r"musterd: serving rendezvous on \S+:(\d+)$", re.M)

# $1: the bad host; $2: the directory. Times are CLOCK_REALTIME in ns (date +%s%N).
WORKER = r'''
host=$(hostname)
stamp() { date +%s%N > "$2/$1.tmp" && mv "$2/$1.tmp" "$2/$1"; }  # never read half written
stamp "start.$host.$TORCHELASTIC_RESTART_COUNT" "$2"
if [ "$host" = "$1" ]; then
  sleep 0.3
  stamp "fail.$TORCHELASTIC_RESTART_COUNT" "$2"
  exit 1
fi
i=0
while [ ! -e "$2/end" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
'''


def wait_for(predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    return None


def read_ns(path):
    with open(path) as f:
        return int(f.read().strip())


def one_run(args, mode, work):
    procs = []
    logs = []

    def spawn(name, argv):
        out = open(os.path.join(work, f"{name}.log"), "w")
        logs.append(out)
        procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True))

    try:
        spawn("musterd", [args.musterd, "--listen", "127.0.0.1", "--port", "0"])
        port = wait_for(lambda: SERVING.search(open(os.path.join(work, "musterd.log")).read()),
                        15)
        if not port:
            raise RuntimeError("musterd did not start")
        port = port.group(1)
        failures = "1" if mode == "excluded" else "0"

        def agent(host):
            spawn(host, ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host,
                         args.muster, "--rdzv-backend", "c10d", "--rdzv-endpoint",
                         f"127.0.0.1:{port}", "--rdzv-id", "bench", "--nnodes", "2",
                         "--nproc-per-node", "1", "--max-restarts", "3",
                         "--max-node-failures", failures, "--rdzv-conf", "is_host=0",
                         "--no-python", "sh", "-c", WORKER, "worker", "nodeA", work])

        agent("nodeA")
        agent("nodeB")
        # The spare joins once round 0 runs (nodeB's worker started).
        if not wait_for(lambda: os.path.exists(os.path.join(work, "start.nodeB.0")), 30):
            raise RuntimeError("round 0 did not start")
        agent("nodeC")
        if not wait_for(lambda: os.path.exists(os.path.join(work, "fail.0")), 30):
            raise RuntimeError("nodeA's worker did not fail")
        # The next round: the spare in nodeA's seat, or nodeA again.
        expected = ["start.nodeB.1", "start.nodeC.1" if mode == "excluded" else "start.nodeA.1"]
        paths = [os.path.join(work, name) for name in expected]
        if not wait_for(lambda: all(os.path.exists(p) for p in paths), args.run_timeout):
            raise RuntimeError(f"round 1 did not start: {os.listdir(work)}")
        failed = read_ns(os.path.join(work, "fail.0"))
        started = max(read_ns(p) for p in paths)
        return (started - failed) / 1e9
    finally:
        open(os.path.join(work, "end"), "w").close()
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
        for log in logs:
            log.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--muster", default=os.path.join(ROOT, "build", "launcher", "muster"))
    parser.add_argument("--musterd", default=os.path.join(ROOT, "build", "rendezvous", "musterd"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--run-timeout", type=float, default=30, help="s, per run")
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        sys.exit("needs root and unshare (util-linux): each agent is a host of its own")
    for path in (args.muster, args.musterd):
        if not os.access(path, os.X_OK):
            sys.exit(f"{path}: not built (ninja -C build)")
    results = {}
    for mode in ("excluded", "restart"):
        times = []
        for run in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="muster-bad-node-") as work:
                try:
                    times.append(one_run(args, mode, work))
                except RuntimeError as error:
                    print(f"{mode} run {run}: {error}", file=sys.stderr)
        results[mode] = times
        if times:
            print(f"{mode:>9}: median {statistics.median(times) * 1000:7.1f} ms, "
                  f"min {min(times) * 1000:7.1f}, max {max(times) * 1000:7.1f} "
                  f"({len(times)} runs)")
    if results.get("excluded") and results.get("restart"):
        ratio = statistics.median(results["excluded"]) / statistics.median(results["restart"])
        print(f"excluded / restart on the same nodes: {ratio:.2f}")
        print(f"goal: 1 s beyond detection; median {statistics.median(results['excluded']):.3f} s")


if __name__ == "__main__":
    main()
