#!/usr/bin/python3
"""Issue 35's chaos soak: a real job under faults, checked as its user would.

  bench/chaos_soak.py --backend musterd|etcd|host [--minutes 30] [--mtbf 60]
                      [--seed S] [--keep DIR]

Three hosts, each a network namespace of its own (tests/integration/
test_netns.py's Topology), run an agent each: `--nnodes 2:3`, two workers a
host, each host with a name of its own; no host is excluded for its
failures (--max-node-failures 0: the faults are not bad hosts). The rendezvous is musterd with --state-dir, or a 3-member etcd
cluster (tests/etcd/cluster.sh), both on the switch's own address, or host
0's agent (host mode). The workers train a checkpointing gloo job whose
"parameters" are integers (exact sums, whatever the world size), so the
job must end with the very parameters it has with no fault.

Faults come one at a time, at exponential intervals of mean --mtbf, each
once the job trains again on all three hosts after the last:
  worker   kill -9 of a worker (spends a restart)
  agent    kill -9 of an agent (its workers die with it); a new one starts
           on its host 2-8 s later, as a supervisor would
  stop     SIGSTOP of an agent for 2-15 s
  link     a host's link down for 3-25 s (ip link set down)
  musterd  kill -9 of musterd, back 1-8 s later on the same journal
  etcd     kill -9 of an etcd member, back 2-8 s later
In host mode, host 0 (where the rendezvous lives) is not faulted: losing it
loses the job, which is issue 36.

Checks, after the last fault, once the job ends:
  - every agent still running exits 0; the digest of the final parameters
    is the one a run with no fault has;
  - every worker kill spent one restart, and the job's restart count is what
    the rendezvous said each restart was for;
  - no process of the job is left, in any namespace;
  - no two rounds ran at once: once a newer round trained, no worker of an
    older one took a step more than the bound after (docs/multi-node.md).
Figures: each fault's time to every rank training again (p50, p99 by kind)
and the job's goodput (its steps at the undisturbed pace, over its wall time).
Needs root (network namespaces) and Debian's python3-torch; exit 77 (skipped)
without them, 1 when a check fails. Loopback and namespaces only.
"""
import argparse
import glob
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from test_netns import SUBNET, Topology, namespaces_usable  # noqa: E402

MUSTER = os.environ.get("MUSTER", os.path.join(ROOT, "build", "launcher", "muster"))
MUSTERD = os.environ.get("MUSTERD", os.path.join(ROOT, "build", "rendezvous", "musterd"))
CLUSTER = os.path.join(ROOT, "tests", "etcd", "cluster.sh")
PYTHON = "/usr/bin/python3"
SERVER = f"{SUBNET}.100"  # musterd's or etcd's address: the switch's own
PORT = 29400
HOSTS = 3
NPROC = 2
BATCH = 12
STEP_SECONDS = 0.2
# The agents' rendezvous settings, and what they make of the bound.
KEEP_ALIVE, HEARTBEAT, GRACE = 1.0, 5.0, 2.0
KEEPALIVE = max(1.0, min(KEEP_ALIVE * 3, HEARTBEAT / 3))  # launcher/run.cc's ClientKeepalive
SPLIT_BRAIN_BOUND = 2 * KEEPALIVE + 1 + GRACE + 1 + STEP_SECONDS
RECOVERY_LIMIT = 180  # seconds a fault may take before the soak calls it lost

WORKER = textwrap.dedent('''\
    import datetime, json, os, sys, time
    import torch
    import torch.distributed as dist
    work, steps, pause, batch = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # The round: its master and restart count name it.
    round_ = "{}:{}/{}/{}".format(os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"],
                                  os.environ["TORCHELASTIC_RESTART_COUNT"], world)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    checkpoint = os.path.join(work, "checkpoint")
    state = torch.zeros(5, dtype=torch.int64)  # step, then the parameters
    if rank == 0 and os.path.exists(checkpoint):
        with open(checkpoint) as f:
            state = torch.tensor(json.load(f), dtype=torch.int64)
    dist.broadcast(state, 0)
    step, params = int(state[0]), state[1:].clone()
    log = open(os.path.join(work, "steps.{}".format(os.getpid())), "a", buffering=1)

    def contribution(step, sample):
        return torch.tensor([(step * 31 + sample * 7) % 101, (step * sample) % 13, step % 17,
                             sample + 1], dtype=torch.int64)

    while step < steps:
        begun = time.time()
        local = torch.zeros(4, dtype=torch.int64)
        for sample in range(rank, batch, world):
            local += contribution(step, sample)
        dist.all_reduce(local)
        params += local
        step += 1
        if rank == 0:
            with open(checkpoint + ".tmp", "w") as f:
                json.dump([step] + params.tolist(), f)
            os.replace(checkpoint + ".tmp", checkpoint)
        log.write(json.dumps({"round": round_, "rank": rank, "world": world, "step": step,
                              "begun": begun, "t": time.time()}) + "\\n")
        time.sleep(pause)
    dist.barrier()
    if rank == 0:
        with open(os.path.join(work, "final"), "w") as f:
            json.dump(params.tolist(), f)
''')


def expected_params(steps):
    params = [0, 0, 0, 0]
    for step in range(steps):
        for sample in range(BATCH):
            for i, v in enumerate([(step * 31 + sample * 7) % 101, (step * sample) % 13, step % 17,
                                   sample + 1]):
                params[i] += v
    return params


def percentile(values, q):
    values = sorted(values)
    if not values:
        return float("nan")
    index = min(len(values) - 1, max(0, int(round(q / 100 * (len(values) - 1)))))
    return values[index]


class Steps:
    """What the workers logged so far, read incrementally: (round, rank, world,
    step, t, begun), t when the step ended and begun when it began."""

    def __init__(self, work):
        self.work = work
        self.offsets = {}
        self.rows = []

    def read(self):
        for path in glob.glob(os.path.join(self.work, "steps.*")):
            with open(path) as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            complete = data[:data.rfind("\n") + 1]
            self.offsets[path] = self.offsets.get(path, 0) + len(complete)
            for line in complete.splitlines():
                row = json.loads(line)
                self.rows.append((row["round"], row["rank"], row["world"], row["step"], row["t"],
                                  row["begun"]))
        return self.rows

    def training_again(self, since, world=None):
        """When every rank of one round had ended a step begun after `since` (the
        first such round, and all its ranks), or None: a step in flight at the
        fault does not count. `world`: only a round of that size."""
        first = {}  # round -> rank -> when its first step begun after since ended
        worlds = {}
        for round_, rank, size, _, t, begun in self.read():
            if begun > since and (world is None or size == world):
                seen = first.setdefault(round_, {})
                seen[rank] = min(seen.get(rank, t), t)
                worlds[round_] = size
        done = [max(ranks.values()) for round_, ranks in first.items()
                if len(ranks) == worlds[round_]]
        return min(done) if done else None


class Soak:
    def __init__(self, args, work):
        self.args = args
        self.work = work
        self.random = random.Random(args.seed)
        self.net = Topology()
        self.agents = {}  # host -> Popen
        self.retired = []  # agents killed on purpose
        self.musterd = None
        self.faults = []  # dicts: kind, at, recovered_at
        self.steps_total = int(args.minutes * 60 / STEP_SECONDS)
        self.logs = os.path.join(work, "logs")
        os.makedirs(self.logs)
        self.cluster = os.path.join(work, "etcd")
        self.launched = 0

    # -- the rendezvous ---------------------------------------------------
    def switch(self, *argv):
        return ["ip", "netns", "exec", self.net.switch, *argv]

    def start_server(self):
        subprocess.run(["ip", "-n", self.net.switch, "addr", "add", f"{SERVER}/24", "dev", "br0"],
                       check=True)
        # Its own address is reached over loopback (etcd's members, each other).
        subprocess.run(["ip", "-n", self.net.switch, "link", "set", "lo", "up"], check=True)
        if self.args.backend == "musterd":
            self.start_musterd()
        elif self.args.backend == "etcd":
            started = subprocess.run(self.switch(CLUSTER, "start", self.cluster), capture_output=True,
                                     text=True, timeout=90, env=self.etcd_env())
            if started.returncode != 0:
                raise RuntimeError(f"etcd did not start: {started.stdout}{started.stderr}")

    def etcd_env(self):
        return {**os.environ, "ETCD_CLUSTER_HOST": SERVER, "ETCD_CLUSTER_OWNER_PID": str(os.getpid())}

    def start_musterd(self):
        log = open(os.path.join(self.logs, "musterd.log"), "a")
        self.musterd = subprocess.Popen(
            self.switch(MUSTERD, "--listen", SERVER, "--port", str(PORT), "--state-dir",
                        os.path.join(self.work, "state")),
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)

    def endpoint(self):
        if self.args.backend == "etcd":
            with open(os.path.join(self.cluster, "endpoints")) as f:
                return f.read().strip()
        return f"{SERVER if self.args.backend == 'musterd' else self.net.address(0)}:{PORT}"

    # -- the agents -------------------------------------------------------
    def start_agent(self, host):
        self.launched += 1
        conf = (f"keep_alive_interval={KEEP_ALIVE},heartbeat_timeout={HEARTBEAT},"
                f"last_call_timeout=1,join_timeout=600")
        if self.args.backend == "musterd":
            conf += ",is_host=0"
        backend = "etcd" if self.args.backend == "etcd" else "c10d"
        log = open(os.path.join(self.logs, f"agent{host}.{self.launched}.log"), "w")
        # A host name of its own (a UTS namespace), as a real host has.
        command = ["ip", "netns", "exec", self.net.hosts[host], "unshare", "--uts", "sh", "-c",
                   f'hostname soak{host} && exec "$@"', "sh", MUSTER, "--nnodes", "2:3",
                   "--nproc-per-node", str(NPROC), "--rdzv-backend", backend, "--rdzv-endpoint",
                   self.endpoint(), "--rdzv-id", "soak", "--rdzv-conf", conf, "--max-restarts",
                   "1000", "--max-node-failures", "0", "--shutdown-timeout", str(GRACE),
                   "--node-rank", str(host), "--local-addr", self.net.address(host),
                   "--no-python", PYTHON, os.path.join(self.work, "worker.py"), self.work, str(self.steps_total),
                   str(STEP_SECONDS), str(BATCH)]
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "PYTHONDONTWRITEBYTECODE": "1"}
        env.pop("OMP_NUM_THREADS", None)
        self.agents[host] = subprocess.Popen(command, env=env, stdout=log, stderr=log,
                                             stdin=subprocess.DEVNULL, start_new_session=True)

    # -- faults -----------------------------------------------------------
    def kinds(self):
        kinds = ["worker", "agent", "stop", "link"]
        if self.args.backend == "musterd":
            kinds.append("musterd")
        if self.args.backend == "etcd":
            kinds.append("etcd")
        return kinds

    def target_host(self):
        first = 1 if self.args.backend == "host" else 0
        return self.random.randrange(first, HOSTS)

    def later(self, seconds, action):
        timer = threading.Timer(seconds, action)
        timer.daemon = True
        timer.start()
        return timer

    def inject(self, kind):
        """Makes the fault; returns when it is over (what it undoes, undone)."""
        host = self.target_host()
        if kind == "worker":
            rows = self.steps.read()
            newest = max(rows, key=lambda r: r[4])[0]
            pids = sorted({int(os.path.basename(p).split(".")[1])
                           for p in glob.glob(os.path.join(self.work, "steps.*"))
                           if self.pid_in_round(p, newest)})
            if not pids:
                return "no worker to kill (the round ended meanwhile)"
            pid = self.random.choice(pids)
            os.kill(pid, signal.SIGKILL)
            return f"worker pid {pid}"
        if kind == "agent":
            agent = self.agents.pop(host)
            agent.kill()
            agent.wait(timeout=30)
            self.retired.append(agent)
            time.sleep(self.random.uniform(2, 8))
            self.start_agent(host)
            return f"agent of host {host}"
        if kind == "stop":
            length = self.random.uniform(2, 15)
            self.agents[host].send_signal(signal.SIGSTOP)
            time.sleep(length)
            self.agents[host].send_signal(signal.SIGCONT)
            return f"agent of host {host} stopped {length:.1f} s"
        if kind == "link":
            length = self.random.uniform(3, 25)
            self.net.cut(host)
            time.sleep(length)
            self.net.mend()
            time.sleep(0.5)
            if self.agents[host].poll() is not None:
                # Host mode: an agent that loses its rendezvous gives up after
                # keep_alive_max_attempt heartbeats (docs/multi-node.md), and
                # its supervisor starts it again.
                self.retired.append(self.agents.pop(host))
                self.start_agent(host)
                return f"link of host {host} down {length:.1f} s (its agent gave up; started again)"
            return f"link of host {host} down {length:.1f} s"
        if kind == "musterd":
            self.musterd.kill()
            self.musterd.wait(timeout=30)
            length = self.random.uniform(1, 8)
            time.sleep(length)
            self.start_musterd()
            return f"musterd down {length:.1f} s"
        member = self.random.randrange(3)
        subprocess.run(self.switch(CLUSTER, "kill", self.cluster, str(member)), check=True,
                       capture_output=True, timeout=60, env=self.etcd_env())
        length = self.random.uniform(2, 8)
        time.sleep(length)
        subprocess.run(self.switch(CLUSTER, "start-member", self.cluster, str(member)), check=True,
                       capture_output=True, timeout=60, env=self.etcd_env())
        return f"etcd member {member} down {length:.1f} s"

    def pid_in_round(self, path, round_):
        with open(path) as f:
            lines = f.read().splitlines()
        alive = os.path.exists(f"/proc/{os.path.basename(path).split('.')[1]}")
        return alive and lines and json.loads(lines[-1])["round"] == round_

    # -- the run ----------------------------------------------------------
    def run(self):
        with open(os.path.join(self.work, "worker.py"), "w") as f:
            f.write(WORKER)
        self.steps = Steps(self.work)
        self.net.create()
        try:
            self.start_server()
            start = time.time()
            for host in range(HOSTS):
                self.start_agent(host)
            if self.steps.training_again(0, world=HOSTS * NPROC) is None:
                self.wait(lambda: self.steps.training_again(0, world=HOSTS * NPROC), 120,
                          "the job never trained on all three hosts")
            self.started = start
            self.fault_loop(start + self.args.minutes * 60)
            return self.finish()
        finally:
            self.tear_down()

    def wait(self, predicate, timeout, what):
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = predicate()
            if value:
                return value
            if any(a.poll() is not None for a in self.agents.values()):
                raise RuntimeError(f"{what}: an agent exited\n{self.tail_logs()}")
            time.sleep(0.2)
        raise RuntimeError(f"{what} (within {timeout} s)\n{self.tail_logs()}")

    def fault_loop(self, end):
        kinds = self.kinds()
        while True:
            gap = self.random.expovariate(1 / self.args.mtbf)
            if time.time() + gap >= end or self.job_done():
                return
            time.sleep(gap)
            if self.job_done():
                return
            kind = kinds[len(self.faults) % len(kinds)] if self.args.cycle else \
                self.random.choice(kinds)
            at = time.time()
            what = self.inject(kind)
            print(f"  {at - self.started:7.1f} s  {kind:8} {what}", flush=True)
            recovered = self.wait(lambda: self.steps.training_again(at, world=HOSTS * NPROC)
                                  or self.job_done(), RECOVERY_LIMIT,
                                  f"the job did not train again on all hosts after: {what}")
            if recovered is True:
                return  # ended meanwhile
            # Training again: every rank of some round stepped after the
            # fault (a cut or killed rank cannot, so no old round counts).
            training = self.steps.training_again(at) or recovered
            self.faults.append({"kind": kind, "what": what, "at": at, "training": training,
                                "recovered": recovered})

    def job_done(self):
        return os.path.exists(os.path.join(self.work, "final"))

    def finish(self):
        problems = []
        codes = {}
        for host, agent in self.agents.items():
            try:
                codes[host] = agent.wait(timeout=self.steps_total * STEP_SECONDS * 2 + 300)
            except subprocess.TimeoutExpired:
                codes[host] = None
        if any(code != 0 for code in codes.values()):
            problems.append(f"agents exited {codes}, not 0")
        final = None
        if self.job_done():
            with open(os.path.join(self.work, "final")) as f:
                final = json.load(f)
        want = expected_params(self.steps_total)
        if final != want:
            problems.append(f"final parameters {final}, a run with no fault ends with {want}")
        problems += self.check_restarts()
        problems += self.check_leftovers()
        overlap = self.check_seats(problems)
        self.report(overlap)
        for problem in problems:
            print(f"FAILED: {problem}", flush=True)
        print(f"{len(self.faults)} faults, {len(problems)} failed checks", flush=True)
        return 1 if problems else 0

    def check_restarts(self):
        problems = []
        text = "\n".join(open(p, errors="replace").read()
                         for p in glob.glob(os.path.join(self.logs, "*.log")))
        spent = {}  # round -> restart, from "round N opened: ...; restart K of M"
        for round_, reason, restart in re.findall(
                r"round (\d+) opened: (.*?); restart (\d+) of \d+", text):
            spent[int(round_)] = (int(restart), reason)
        final = max((int(r[0].split("/")[1]) for r in self.steps.read()), default=0)
        restarts = sorted({k for k, _ in spent.values()})
        if restarts != list(range(1, final + 1)):
            problems.append(f"the job's restart count is {final}, but the rendezvous said "
                            f"restarts {restarts} were spent")
        kills = sum(1 for f in self.faults if f["kind"] == "worker")
        if final < kills:
            problems.append(f"{kills} worker(s) were killed, but only {final} restart(s) spent")
        self.restarts = (final, kills)
        return problems

    def check_leftovers(self):
        time.sleep(1)
        # Agents and workers name the worker script; the rendezvous is torn down after.
        left = subprocess.run(["pgrep", "-f", os.path.join(self.work, "worker.py")],
                              capture_output=True, text=True).stdout
        return [f"processes of the job left behind: {left.split()}"] if left.strip() else []

    def check_seats(self, problems):
        """The most an older round stepped after a newer one began (rank 0 of
        an older round writing the checkpoint over the newer one's, say)."""
        first, last = {}, {}  # round -> time
        for round_, _, _, _, t, _ in self.steps.read():
            first[round_] = min(first.get(round_, t), t)
            last[round_] = max(last.get(round_, t), t)
        worst = 0.0
        for newer, began in first.items():
            for older, ended in last.items():
                if first[older] < began:
                    worst = max(worst, ended - began)
        if worst > SPLIT_BRAIN_BOUND:
            problems.append(f"an older round stepped {worst:.2f} s after a newer one began; "
                            f"the bound is {SPLIT_BRAIN_BOUND:.2f} s")
        return worst

    def report(self, overlap):
        rows = self.steps.read()
        print(f"backend {self.args.backend}, {self.args.minutes} min, mtbf {self.args.mtbf} s, "
              f"seed {self.args.seed}: {len(self.faults)} faults", flush=True)
        by_kind = {}
        for fault in self.faults:
            by_kind.setdefault(fault["kind"], []).append(
                (fault["training"] - fault["at"], fault["recovered"] - fault["at"]))
        print("  fault     count   -> every rank training again   -> all 3 hosts training",
              flush=True)
        for kind in sorted(by_kind):
            training = [t for t, _ in by_kind[kind]]
            full = [f for _, f in by_kind[kind]]
            print(f"  {kind:8} {len(training):5}   p50 {percentile(training, 50):6.2f} s  p99 "
                  f"{percentile(training, 99):6.2f} s    p50 {percentile(full, 50):6.2f} s  p99 "
                  f"{percentile(full, 99):6.2f} s", flush=True)
        if rows:
            begin = min(r[4] for r in rows)
            end = max(r[4] for r in rows)
            ordered = sorted(r[4] for r in rows if r[1] == 0)
            pace = statistics.median(b - a for a, b in zip(ordered, ordered[1:])) \
                if len(ordered) > 1 else STEP_SECONDS
            ideal = self.steps_total * pace
            print(f"  goodput {ideal / max(end - begin, 1e-9):.3f} ({self.steps_total} steps at "
                  f"the undisturbed {pace * 1000:.0f} ms a step = {ideal:.0f} s, over "
                  f"{end - begin:.0f} s from the first step to the last)", flush=True)
        final, kills = self.restarts
        print(f"  restarts {final}: {kills} for killed workers, {final - kills} for workers that "
              f"failed as their peers vanished (node faults)", flush=True)
        print(f"  rounds: an older round's last step came at most {overlap:.2f} s after a newer "
              f"round's first (bound {SPLIT_BRAIN_BOUND:.2f} s)", flush=True)

    def tail_logs(self):
        out = []
        for path in sorted(glob.glob(os.path.join(self.logs, "*.log"))):
            with open(path, errors="replace") as f:
                out.append(f"--- {os.path.basename(path)}\n" + "".join(f.readlines()[-15:]))
        return "\n".join(out)

    def tear_down(self):
        self.net.mend()
        for agent in [*self.agents.values(), *self.retired]:
            if agent.poll() is None:
                try:
                    os.killpg(agent.pid, signal.SIGCONT)
                    os.killpg(agent.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                agent.wait(timeout=30)
        if self.musterd and self.musterd.poll() is None:
            self.musterd.kill()
            self.musterd.wait(timeout=30)
        if self.args.backend == "etcd":
            subprocess.run(self.switch(CLUSTER, "stop", self.cluster), capture_output=True,
                           timeout=60, env=self.etcd_env())
        self.net.destroy()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("musterd", "etcd", "host"), required=True)
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--mtbf", type=float, default=60, help="mean seconds between faults")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cycle", action="store_true",
                        help="take the fault kinds in turn instead of at random")
    parser.add_argument("--keep", help="work in this directory, and keep it")
    args = parser.parse_args()
    why = namespaces_usable()
    if why is None:
        try:
            import torch  # noqa: F401
        except ImportError:
            why = "needs Debian's python3-torch for its workers"
    if why is None and args.backend == "etcd" and not shutil.which("etcd"):
        why = "needs etcd (scripts/setup installs etcd-server)"
    if why:
        print(f"chaos_soak: skipped: {why}")
        return 77
    # Stopped by hand or by ctest's timeout: the finally clauses tear down
    # the namespaces and every process of the job.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _: sys.exit(128 + signum))
    work = args.keep or tempfile.mkdtemp(prefix="muster-soak-")
    os.makedirs(work, exist_ok=True)
    try:
        return Soak(args, work).run()
    except RuntimeError as e:
        print(f"FAILED: {e}", flush=True)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
