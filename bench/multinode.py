#!/usr/bin/python3
"""Multi-node figures on loopback: muster against torchrun's c10d, same run.

  bench/multinode.py [--muster PATH] [--agents 16] [--skip-torchrun]
                     [--backend muster|etcd|both|ha]

Restart latency: two agents (--nnodes 2, one worker each, --max-restarts 1);
rank 1 exits 1 once; the time from that exit until every worker of the next
attempt has started. Workers are /bin/sh, which stamp the clock themselves.
Start-up: N agents (--nnodes N, one worker each), from the moment the first
agent is started until every worker has started.

--backend says which rendezvous the agents use:
  muster  (the default) muster's c10d rendezvous hosted by an agent (in its
          own server: ha=0, which --backend ha compares with the default
          where etcd is installed), and torchrun's c10d for the ratio
          (unless --skip-torchrun).
  etcd    --rdzv-backend etcd on a 3-member etcd cluster on loopback
          (tests/etcd/cluster.sh, started in a temporary directory for the
          bench and stopped at its end), and for comparison, in the same run,
          a musterd (--musterd, started for the bench; agents with
          --rdzv-conf is_host=0), the same musterd with --state-dir (it syncs
          its journal, as etcd syncs its log), and the hosting agent.
  both    all of them.
  ha      the hosting agent with ha=0 and with --rdzv-conf ha=1 (the job's
          rendezvous on an etcd cluster of its own agents: the hosting one
          starts its first member, the others offer theirs), in the same
          run, and what ha=1 adds (issue 36: at most 1 s at start with 16
          agents, at most 50 ms to a restart).
The etcd cluster and the musterds serve every run of the bench, each run a
job of its own (--rdzv-id); they are up before the timed part starts.
"""
import argparse
import contextlib
import glob
import itertools
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TORCHRUN = ["/usr/bin/python3", os.path.join(ROOT, "tests", "integration", "torchrun.py")]
CLUSTER = os.path.join(ROOT, "tests", "etcd", "cluster.sh")
# A job id per run where the rendezvous serves several runs (musterd, etcd).
_jobs = itertools.count()

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
                  conf="", endpoint=None):
    """conf: more --rdzv-conf KEY=VALUE pairs for muster (token_file=..., TLS files).
    launcher: "muster" (the agent on `port` hosts the rendezvous; in its own
    server, ha=0, unless conf gives ha), "musterd"
    (a musterd at `endpoint`, HOST:PORT), "etcd" (the etcd members at
    `endpoint`, HOST:PORT,...) or "torchrun"."""
    worker = ["sh", "-c", WORKER, "worker", directory]
    if launcher in ("muster", "musterd", "etcd"):
        own_server = launcher == "muster" and "ha=" not in conf
        rdzv_conf = ",".join(filter(None, ["last_call_timeout=1",
                                           "is_host=0" if launcher == "musterd" else "",
                                           "ha=0" if own_server else "", conf]))
        backend = "etcd" if launcher == "etcd" else "c10d"
        where = f"127.0.0.1:{port}" if launcher == "muster" else endpoint
        return [muster, "--nnodes", str(nnodes), "--nproc-per-node", "1", "--rdzv-backend", backend,
                "--rdzv-endpoint", where, "--rdzv-id", job, "--max-restarts",
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


def restart_latency(launcher, muster, torch_interval=None, endpoint=None):
    return restart_run(launcher, muster, torch_interval, endpoint=endpoint)[0]


def job_id(name, endpoint):
    """`name`, made unique per run where one rendezvous serves many runs."""
    return name if endpoint is None else f"{name}-{os.getpid()}-{next(_jobs)}"


def restart_run(launcher, muster, torch_interval=None, fail_after=None, log_dir=None, env=None,
                timeout=120, conf="", endpoint=None):
    """One restart: (latency in ms, when rank 1 failed in s after the agents
    started). fail_after: seconds after the agents start at which rank 1
    fails (default: 1.5 s after it starts). env: extra variables for the
    agents. endpoint: where a rendezvous that is not an agent's is (musterd, etcd)."""
    with tempfile.TemporaryDirectory(prefix="muster-bench-") as d, reserved_port() as port:
        env = dict(os.environ, FAIL="1", SLEEP="0.5", OMP_NUM_THREADS="1", **(env or {}))
        job = job_id("restart", endpoint)
        commands = [agent_command(launcher, muster, 2, port, job, 1, d, torch_interval, conf,
                                  endpoint) for _ in range(2)]
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


def startup(launcher, muster, agents, torch_interval=None, conf="", endpoint=None):
    with tempfile.TemporaryDirectory(prefix="muster-bench-") as d, reserved_port() as port:
        env = dict(os.environ, FAIL="0", SLEEP="0.5", OMP_NUM_THREADS="1")
        job = job_id("startup", endpoint)
        commands = [agent_command(launcher, muster, agents, port, job, 0, d, torch_interval,
                                  conf, endpoint) for _ in range(agents)]
        began, codes = run_agents(commands, env, timeout=300)
        if any(codes):
            sys.exit(f"{launcher}: agents exited {codes}")
        started = stamps(d, "start.*")
        if len(started) != agents:
            sys.exit(f"{launcher}: {len(started)} workers started, want {agents}")
        return (max(started.values()) - began) / 1e6


@contextlib.contextmanager
def etcd_cluster():
    """A 3-member etcd cluster (tests/etcd/cluster.sh) in a temporary
    directory: yields its members, "127.0.0.1:P0,127.0.0.1:P1,127.0.0.1:P2".
    Stopped on the way out, whatever happened (and by the script's watchdog
    if the bench itself is killed)."""
    with tempfile.TemporaryDirectory(prefix="muster-bench-etcd-") as d:
        try:
            started = subprocess.run([CLUSTER, "start", d], capture_output=True, text=True,
                                     timeout=120, stdin=subprocess.DEVNULL,
                                     env=dict(os.environ, ETCD_CLUSTER_OWNER_PID=str(os.getpid())))
            if started.returncode != 0:
                sys.exit(f"the etcd cluster did not start:\n{started.stdout}{started.stderr}")
            with open(os.path.join(d, "endpoints")) as f:
                yield f.read().strip()
        finally:
            subprocess.run([CLUSTER, "stop", d], capture_output=True, timeout=60,
                           stdin=subprocess.DEVNULL)


@contextlib.contextmanager
def musterd_server(musterd, durable=False):
    """A musterd on a reserved loopback port (with --state-dir in a
    temporary directory if `durable`): yields "127.0.0.1:PORT" once it
    serves; stopped (SIGTERM, then SIGKILL) on the way out."""
    with tempfile.TemporaryDirectory(prefix="muster-bench-musterd-") as d, \
            reserved_port() as port:
        command = [musterd, "--listen", "127.0.0.1", "--port", str(port)]
        if durable:
            command += ["--state-dir", os.path.join(d, "state")]
        out_path, err_path = os.path.join(d, "out"), os.path.join(d, "err")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(command, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 15
            while True:
                with open(out_path) as f:
                    if "serving rendezvous on" in f.read():
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    with open(err_path) as f:
                        sys.exit(f"musterd did not serve (exit {proc.poll()}): {f.read()[-2000:]}")
                time.sleep(0.02)
            yield f"127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def spread(values, digits):
    values = sorted(values)
    return f"{values[0]:.{digits}f}-{values[-1]:.{digits}f}"


# The rendezvous the agents of each row use, with --backend etcd or both:
# (name, label).
SERVED = [("muster", "muster, an agent hosts c10d (ha=0)"),
          ("musterd", "muster, musterd"),
          ("musterd-durable", "muster, musterd --state-dir"),
          ("etcd", "muster, etcd (3 members)")]


def run_served(args, endpoints):
    """The rows of SERVED, runs interleaved (run 1 of each, then run 2 of
    each...) so that the machine's load drifts over all of them alike."""
    restart = {name: [] for name, _ in SERVED}
    start = {name: [] for name, _ in SERVED}
    for _ in range(args.runs):
        for name, _ in SERVED:
            launcher = "musterd" if name == "musterd-durable" else name
            restart[name].append(restart_latency(launcher, args.muster, endpoint=endpoints[name]))
    for _ in range(args.runs):
        for name, _ in SERVED:
            launcher = "musterd" if name == "musterd-durable" else name
            start[name].append(startup(launcher, args.muster, args.agents,
                                       endpoint=endpoints[name]))

    def table(title, runs, digits, goal_ms):
        print(title)
        base = median(runs["musterd"])
        for name, label in SERVED:
            m = median(runs[name])
            ratio = f"  etcd/this {median(runs['etcd']) / m:5.1f}x" if name != "etcd" else ""
            print(f"  {label:32s}{m:8.{digits}f} ms  ({spread(runs[name], digits)}; all: "
                  f"{', '.join(f'{r:.{digits}f}' for r in runs[name])}){ratio}")
        e = median(runs["etcd"])
        goal = "" if goal_ms is None else (
            f"; goal over etcd (issue 12) at most {goal_ms} ms: "
            f"{'met' if e <= goal_ms else 'missed'} ({e:.{digits}f} ms)")
        print(f"  ratio etcd/musterd {e / base:.2f}x{goal}")

    table(f"restart latency, 2 agents on loopback (median of {args.runs})", restart, 1, 150)
    table(f"start-up, {args.agents} agents on loopback until every worker runs (median of "
          f"{args.runs})", start, 0, 1000 if args.agents == 16 else None)


def failover(muster, heartbeat_timeout, log_dir=None):
    """ha=1, three agents (--nnodes 2:3): once the job's etcd has its three
    members, the hosting agent is killed (SIGKILL: its workers and its
    member die with it); the time until both other agents' workers run
    again, in seconds."""
    conf = f"ha=1,heartbeat_timeout={heartbeat_timeout},keep_alive_interval=0.5"
    with tempfile.TemporaryDirectory(prefix="muster-bench-") as d, reserved_port() as port:
        env = dict(os.environ, FAIL="0", SLEEP="60", OMP_NUM_THREADS="1")
        commands = [agent_command("muster", muster, "2:3", port, "failover", 0, d, None, conf)
                    for _ in range(3)]
        logs = [os.path.join(log_dir or d, f"failover.{i}.log") for i in range(3)]
        procs = []
        try:
            for command, log in zip(commands, logs):
                with open(log, "wb") as err:
                    procs.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                                                  stderr=err, stdin=subprocess.DEVNULL))

            def read(i):
                with open(logs[i], errors="replace") as f:
                    return f.read()

            deadline = time.monotonic() + 60
            # Three workers, and two learners promoted (the leader says so).
            while (len(stamps(d, "start.*")) < 3 or
                   sum(read(i).count("is a voter") for i in range(3)) < 2):
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    sys.exit("ha=1: the job or its etcd did not form:\n" +
                             "\n".join(read(i)[-3000:] for i in range(3)))
                time.sleep(0.05)
            host = next(i for i in range(3) if "hosting the rendezvous" in read(i))
            killed = time.time_ns()
            procs[host].kill()
            procs[host].wait()
            deadline = time.monotonic() + 60
            while len([ns for ns in stamps(d, "start.*").values() if ns > killed]) < 2:
                if time.monotonic() > deadline:
                    sys.exit("ha=1: the others did not train again:\n" +
                             "\n".join(read(i)[-3000:] for i in range(3) if i != host))
                time.sleep(0.02)
            again = sorted(ns for ns in stamps(d, "start.*").values() if ns > killed)
            return (again[1] - killed) / 1e9
        finally:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def run_ha(args):
    """The hosting agent without and with ha=1, runs interleaved."""
    rows = [("", "muster, an agent hosts c10d (ha=0)"),
            ("ha=1", "muster, ha=1 (the job's own etcd)")]
    restart = {conf: [] for conf, _ in rows}
    start = {conf: [] for conf, _ in rows}
    for _ in range(args.runs):
        for conf, _ in rows:
            restart[conf].append(restart_run("muster", args.muster, conf=conf)[0])
    for _ in range(args.runs):
        for conf, _ in rows:
            start[conf].append(startup("muster", args.muster, args.agents, conf=conf))

    def table(title, runs, digits, goal_ms):
        print(title)
        for conf, label in rows:
            print(f"  {label:36s}{median(runs[conf]):8.{digits}f} ms  ({spread(runs[conf], digits)};"
                  f" all: {', '.join(f'{r:.{digits}f}' for r in runs[conf])})")
        added = median(runs["ha=1"]) - median(runs[""])
        ratio = median(runs["ha=1"]) / median(runs[""])
        print(f"  ha=1 adds {added:.{digits}f} ms (ratio {ratio:.2f}x); goal at most {goal_ms} ms: "
              f"{'met' if added <= goal_ms else 'missed'}")

    table(f"restart latency, 2 agents on loopback (median of {args.runs})", restart, 1, 50)
    table(f"start-up, {args.agents} agents on loopback until every worker runs (median of "
          f"{args.runs})", start, 0, 1000)
    for heartbeat_timeout in args.heartbeat_timeouts:
        runs = [failover(args.muster, heartbeat_timeout) for _ in range(args.runs)]
        m = median(runs)
        goal = heartbeat_timeout + 2
        print(f"hosting agent killed (ha=1, heartbeat_timeout={heartbeat_timeout}) -> the other "
              f"two train again: {m:.2f} s ({spread(runs, 2)}; all: "
              f"{', '.join(f'{r:.2f}' for r in runs)}); goal at most {goal} s: "
              f"{'met' if m <= goal else 'missed'}; without ha=1 the job ends (exit 1)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--muster", default=os.path.join(ROOT, "build", "launcher", "muster"))
    parser.add_argument("--musterd", default=os.path.join(ROOT, "build", "rendezvous", "musterd"))
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--skip-torchrun", action="store_true")
    parser.add_argument("--heartbeat-timeouts", type=float, nargs="*", default=[3, 10],
                        help="--backend ha: the heartbeat_timeouts of the failover rows")
    parser.add_argument("--backend", choices=["muster", "etcd", "both", "ha"], default="muster",
                        help="muster: the hosting agent (and torchrun); etcd: etcd, musterd and "
                             "the hosting agent; both: all; ha: the hosting agent with and "
                             "without ha=1")
    args = parser.parse_args()
    if args.backend == "ha":
        run_ha(args)
        return

    if args.backend in ("etcd", "both"):
        with contextlib.ExitStack() as stack:
            endpoints = {"muster": None,
                         "musterd": stack.enter_context(musterd_server(args.musterd)),
                         "musterd-durable": stack.enter_context(
                             musterd_server(args.musterd, durable=True)),
                         "etcd": stack.enter_context(etcd_cluster())}
            print(f"etcd members {endpoints['etcd']}; musterd {endpoints['musterd']}, "
                  f"with --state-dir {endpoints['musterd-durable']}", flush=True)
            run_served(args, endpoints)
        if args.backend == "etcd":
            return

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
