#!/usr/bin/python3
"""Multi-node figures on loopback: muster against torchrun's c10d, same run.

  bench/multinode.py [--muster PATH] [--agents 16] [--skip-torchrun]

Restart latency: two agents (--nnodes 2, one worker each, --max-restarts 1);
rank 1 exits 1 once; the time from that exit until every worker of the next
attempt has started. Workers are /bin/sh, which stamp the clock themselves.
Start-up: N agents (--nnodes N, one worker each), from the moment the first
agent is started until every worker has started.
"""
import argparse
import contextlib
import glob
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TORCHRUN = ["/usr/bin/python3", os.path.join(ROOT, "tests", "integration", "torchrun.py")]

# Stamps its start (ns) in DIR/start.<restart>.<rank>.<pid>. With FAIL=1, rank 1
# of attempt 0 stamps DIR/exit and exits 1 (1.5 s after it started, or at
# FAIL_AT, a wall-clock time in ns), while the others of attempt 0 sleep
# until they are stopped; later attempts end after SLEEP seconds.
WORKER = r'''
d=$1
echo $(date +%s%N) > $d/start.$TORCHELASTIC_RESTART_COUNT.$RANK.$$
if [ "$FAIL" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  if [ "$RANK" = 1 ]; then
    if [ -n "$FAIL_AT" ]; then
      ns=$((FAIL_AT - $(date +%s%N)))
      [ $ns -gt 0 ] && sleep $((ns / 1000000000)).$(printf %09d $((ns % 1000000000)))
    else
      sleep 1.5
    fi
    date +%s%N > $d/exit; exit 1
  fi
  sleep 60
fi
sleep ${SLEEP:-1}
'''


@contextlib.contextmanager
def reserved_port():
    """A loopback port for the rendezvous, held instead of raced for, as
    tests/integration/harness.py reserve_port() holds one: bound
    (SO_REUSEADDR, never listening) until the run ends, so no other bind to
    port 0 is handed it meanwhile. The agent that hosts the rendezvous can
    still listen on it: gRPC and PyTorch's TCPStore set SO_REUSEADDR too."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def agent_command(launcher, muster, nnodes, port, job, max_restarts, directory, torch_interval,
                  conf=""):
    """conf: more --rdzv-conf KEY=VALUE pairs for muster (token_file=..., TLS files)."""
    worker = ["sh", "-c", WORKER, "worker", directory]
    if launcher == "muster":
        rdzv_conf = "last_call_timeout=1" + ("," + conf if conf else "")
        return [muster, "--nnodes", str(nnodes), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", job, "--max-restarts",
                str(max_restarts), "--rdzv-conf", rdzv_conf, "--no-python", *worker]
    extra = ["--monitor_interval", str(torch_interval)] if torch_interval else []
    return TORCHRUN + ["--nnodes", str(nnodes), "--nproc_per_node", "1", "--rdzv_backend", "c10d",
                       "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", job, "--max_restarts",
                       str(max_restarts), *extra, "--no_python", *worker]


def run_agents(commands, env, timeout, log_dir=None):
    """Starts the agents together and waits for them; their stderr goes to
    LOG_DIR/agent.<i>.log when a log_dir is given."""
    procs = []
    logs = [open(os.path.join(log_dir, f"agent.{i}.log"), "wb") if log_dir else subprocess.DEVNULL
            for i in range(len(commands))]
    try:
        started = time.time_ns()
        for command, log in zip(commands, logs):
            procs.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                                          stderr=log, stdin=subprocess.DEVNULL))
        for p in procs:
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                    q.wait()
                sys.exit(f"agents did not finish in {timeout} s: {commands[0][:3]}")
    finally:
        for log in logs:
            if log is not subprocess.DEVNULL:
                log.close()
    return started, [p.returncode for p in procs]


def stamps(directory, pattern):
    out = {}
    for path in glob.glob(os.path.join(directory, pattern)):
        with open(path) as f:
            out[os.path.basename(path)] = int(f.read().strip())
    return out


def restart_latency(launcher, muster, torch_interval=None):
    return restart_run(launcher, muster, torch_interval)[0]


def restart_run(launcher, muster, torch_interval=None, fail_after=None, log_dir=None, env=None,
                timeout=120, conf=""):
    """One restart: (latency in ms, when rank 1 failed in s after the agents
    started). fail_after: seconds after the agents start at which rank 1
    fails (default: 1.5 s after it starts). env: extra variables for the
    agents."""
    with tempfile.TemporaryDirectory(prefix="muster-bench-") as d, reserved_port() as port:
        env = dict(os.environ, FAIL="1", SLEEP="0.5", OMP_NUM_THREADS="1", **(env or {}))
        commands = [agent_command(launcher, muster, 2, port, "restart", 1, d, torch_interval, conf)
                    for _ in range(2)]
        if fail_after is not None:
            env["FAIL_AT"] = str(time.time_ns() + int(fail_after * 1e9))
        began, codes = run_agents(commands, env, timeout=timeout, log_dir=log_dir)
        if codes != [0, 0]:
            sys.exit(f"{launcher}: agents exited {codes}")
        exit_ns = stamps(d, "exit")["exit"]
        # Each rank's first start after the failure. (torchrun's restart count
        # is per agent: a node restarted for the others' failure may say 0.)
        first = {}
        for name, ns in stamps(d, "start.*").items():
            rank = name.split(".")[2]
            if ns > exit_ns and (rank not in first or ns < first[rank]):
                first[rank] = ns
        if len(first) != 2:
            sys.exit(f"{launcher}: {len(first)} ranks restarted, want 2")
        return (max(first.values()) - exit_ns) / 1e6, (exit_ns - began) / 1e9


def startup(launcher, muster, agents, torch_interval=None, conf=""):
    with tempfile.TemporaryDirectory(prefix="muster-bench-") as d, reserved_port() as port:
        env = dict(os.environ, FAIL="0", SLEEP="0.5", OMP_NUM_THREADS="1")
        commands = [agent_command(launcher, muster, agents, port, "startup", 0, d, torch_interval,
                                  conf) for _ in range(agents)]
        began, codes = run_agents(commands, env, timeout=300)
        if any(codes):
            sys.exit(f"{launcher}: agents exited {codes}")
        started = stamps(d, "start.*")
        if len(started) != agents:
            sys.exit(f"{launcher}: {len(started)} workers started, want {agents}")
        return (max(started.values()) - began) / 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--muster", default=os.path.join(ROOT, "build", "launcher", "muster"))
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--skip-torchrun", action="store_true")
    args = parser.parse_args()

    runs = sorted(restart_latency("muster", args.muster) for _ in range(args.runs))
    m = runs[len(runs) // 2]
    print(f"restart latency, 2 agents on loopback (median of {args.runs}, all: "
          f"{', '.join(f'{r:.1f}' for r in runs)} ms)")
    print(f"  muster                          {m:8.1f} ms")
    if not args.skip_torchrun:
        t = restart_latency("torchrun", args.muster, torch_interval=0.1)
        print(f"  torchrun --monitor_interval 0.1 {t:8.1f} ms  ratio {t / m:6.1f}x")
        t = restart_latency("torchrun", args.muster)
        print(f"  torchrun (default interval)     {t:8.1f} ms  ratio {t / m:6.1f}x")

    runs = sorted(startup("muster", args.muster, args.agents) for _ in range(args.runs))
    m = runs[len(runs) // 2]
    print(f"start-up, {args.agents} agents on loopback until every worker runs (median of "
          f"{args.runs}, all: {', '.join(f'{r:.0f}' for r in runs)} ms)")
    print(f"  muster                          {m:8.1f} ms")
    if not args.skip_torchrun:
        t = startup("torchrun", args.muster, args.agents, torch_interval=0.1)
        print(f"  torchrun --monitor_interval 0.1 {t:8.1f} ms  ratio {t / m:6.1f}x")


if __name__ == "__main__":
    main()
