"""--rdzv-backend etcd (issue 12): real muster agents on a real 3-member etcd
cluster on loopback (tests/etcd/cluster.sh), with etcd members and agents
killed while jobs run."""
import glob
import os
import signal
import subprocess
import time
import unittest

from harness import (MUSTER, ROOT, OnDemandWorkers, TempDirTest, env, pid_alive, read_file, run,
                     wait_for)

CLUSTER = os.path.join(ROOT, "tests", "etcd", "cluster.sh")
ETCD = "/usr/bin/etcd"
ETCDCTL = "/usr/bin/etcdctl"


class EtcdTest(OnDemandWorkers, TempDirTest):
    """A 3-member etcd cluster of the test's own, and agents whose workers end
    when the test says (workers/on_demand.py)."""

    def setUp(self):
        super().setUp()
        if not (os.path.exists(ETCD) and os.path.exists(ETCDCTL)):
            self.skipTest("no etcd here (scripts/setup installs etcd-server and etcd-client)")
        self.cluster = self.path("etcd")
        started = subprocess.run([CLUSTER, "start", self.cluster], capture_output=True, text=True,
                                 timeout=60, env={**os.environ,
                                                  "ETCD_CLUSTER_OWNER_PID": str(os.getpid())})
        self.addCleanup(subprocess.run, [CLUSTER, "stop", self.cluster], capture_output=True,
                        timeout=60)
        self.assertEqual(started.returncode, 0, started.stdout + started.stderr)
        self.endpoints = read_file(os.path.join(self.cluster, "endpoints")).strip()
        self.work = self.path("work")
        os.makedirs(self.work)
        self.names = []

    def cluster_cmd(self, command, *args):
        """cluster.sh COMMAND DIR ARGS...: its output, once it succeeded."""
        result = subprocess.run([CLUSTER, command, self.cluster, *args], capture_output=True,
                                text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        return result.stdout.strip()

    def etcd_leader(self):
        return int(self.cluster_cmd("leader"))

    def agent(self, name, nnodes="2", max_restarts=2, conf="heartbeat_timeout=5,last_call_timeout=1",
              endpoints=None):
        out = open(self.path(f"{name}.out"), "w")
        err = open(self.path(f"{name}.err"), "w")
        proc = subprocess.Popen(
            [MUSTER, "--rdzv-backend", "etcd", "--rdzv-endpoint", endpoints or self.endpoints,
             "--rdzv-id", "etcd-job", "--nnodes", nnodes, "--nproc-per-node", "1",
             "--max-restarts", str(max_restarts), "--rdzv-conf", conf,
             "--no-python", "/usr/bin/python3", self.ON_DEMAND, self.work],
            env=env(), stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        self.addCleanup(self._reap, proc, out, err)
        self.names.append(name)
        return proc

    def workers_of_world(self, attempt, world):
        """The pid files of `attempt` whose worker runs in a world of `world`."""
        out = []
        for path in glob.glob(os.path.join(self.work, f"pid.{attempt}.*")):
            if path.endswith(".tmp"):
                continue
            try:
                with open(f"/proc/{int(read_file(path))}/environ", "rb") as f:
                    environ = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
            except (OSError, ValueError):
                continue
            if environ.get(b"WORLD_SIZE") == str(world).encode():
                out.append(path)
        return out

    def logs(self):
        return "\n".join(f"--- {n}\n{self.read(n + '.err')}" for n in self.names)

    def wait_exit(self, proc, name, timeout=90):
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.fail(f"{name} still running after {timeout} s:\n{self.logs()}")

    def job_keys(self):
        result = subprocess.run([ETCDCTL, "--endpoints", self.endpoints, "get", "--prefix",
                                 "/muster/v1/jobs/etcd-job/", "--keys-only"],
                                capture_output=True, text=True, timeout=30,
                                env={**os.environ, "ETCDCTL_API": "3"})
        self.assertEqual(result.returncode, 0, result.stderr)
        return [k for k in result.stdout.split("\n") if k]


class EtcdJob(EtcdTest):
    """4: a 2-node job with a failure and a restart completes over a 3-member
    cluster whose leader is SIGKILLed while the job runs, brought back, and
    whose new leader is SIGKILLed during the restart round; the job's keys
    are gone once it closes."""

    def test_a_job_through_two_etcd_leader_kills(self):
        agents = [self.agent(f"a{n}") for n in range(2)]
        first = self.pids(0)
        killed = self.etcd_leader()
        self.cluster_cmd("kill", str(killed))
        time.sleep(2)  # an election and then some, the job running on
        for rank, pid in first.items():
            self.assertTrue(pid_alive(pid), f"rank {rank} was disturbed:\n{self.logs()}")
        for agent in agents:
            self.assertIsNone(agent.poll(), self.logs())
        self.cluster_cmd("start-member", str(killed))

        # A failure, and the etcd leader killed as the restart round forms.
        self.fail_rank(1, 0)
        self.cluster_cmd("kill", str(self.etcd_leader()))
        second = self.pids(1)
        self.assertEqual(self.attempts(), [0, 1])
        for n in range(2):
            self.assertIn("restarts 1/2", self.read(f"a{n}.err"))
        self.finish_workers()
        for n, agent in enumerate(agents):
            self.assertEqual(self.wait_exit(agent, f"a{n}"), 0, self.logs())
        self.assertEqual(self.attempts(), [0, 1], "a worker was restarted more than once")
        self.assertEqual(len(set(second.values())), 2)
        # Every key of the job is gone but the one that says how it ended.
        self.assertEqual(self.job_keys(), ["/muster/v1/jobs/etcd-job/closed"])


class EtcdLostNode(EtcdTest):
    """5: a node SIGKILLed is dropped when its lease expires, and the survivors
    re-form (MIN:MAX)."""

    def test_a_killed_node_is_dropped_at_its_lease_end_and_the_rest_reform(self):
        agents = [self.agent(f"a{n}", nnodes="2:3") for n in range(3)]
        self.pids(0, ranks=3)
        # Kill one that does not lead (the leader's loss is EtcdLeaderLoss's).
        leads = [n for n in range(3) if "leads the rendezvous" in self.read(f"a{n}.err")]
        self.assertEqual(len(leads), 1, self.logs())
        victim = next(n for n in range(3) if n != leads[0])
        os.killpg(agents[victim].pid, signal.SIGKILL)
        killed_at = time.monotonic()
        # Its workers die with it; the others come back as a world of 2.
        # A membership change: restart count 0 still, world size 2.
        reformed = wait_for(lambda: len(self.workers_of_world(0, 2)) == 2, timeout=60)
        self.assertTrue(reformed, self.logs())
        elapsed = time.monotonic() - killed_at
        self.assertGreater(elapsed, 3, "dropped before its lease (5 s) could have ended")
        survivors = [n for n in range(3) if n != victim]
        leader_log = self.read(f"a{leads[0]}.err")
        self.assertIn("etcd lease ended", leader_log)
        self.finish_workers()
        for n in survivors:
            self.assertEqual(self.wait_exit(agents[n], f"a{n}"), 0, self.logs())


class EtcdLeaderLoss(EtcdTest):
    """The agent that runs the job's state machine is SIGKILLed: another takes
    over from the state in etcd when its lease ends, drops it, and the
    survivors finish the job with the restart count they had."""

    def test_another_agent_takes_over(self):
        agents = [self.agent(f"a{n}", nnodes="2:3", max_restarts=3) for n in range(3)]
        self.pids(0, ranks=3)
        self.fail_rank(2, 0)  # restart 1 of 3 before the leader goes
        self.pids(1, ranks=3)
        leads = [n for n in range(3) if "leads the rendezvous" in self.read(f"a{n}.err")]
        self.assertEqual(len(leads), 1, self.logs())
        os.killpg(agents[leads[0]].pid, signal.SIGKILL)
        survivors = [n for n in range(3) if n != leads[0]]
        # A survivor takes over from the state the dead leader left in etcd.
        took_over = wait_for(lambda: any("its state restored" in self.read(f"a{n}.err")
                                         for n in survivors), timeout=30)
        self.assertTrue(took_over, self.logs())
        # The lost node is a membership change: no restart used, world size 2.
        moved = wait_for(lambda: len(self.workers_of_world(1, 2)) == 2, timeout=60)
        self.assertTrue(moved, self.logs())
        self.finish_workers()
        for n in survivors:
            self.assertEqual(self.wait_exit(agents[n], f"a{n}"), 0, self.logs())
        self.assertNotIn("restarts 2/3", self.logs())


class EtcdBadInput(EtcdTest):
    """Bad input gets a clear error and exit 2; an etcd that is not there is
    waited for until join_timeout, then named."""

    def test_usage_errors(self):
        base = [MUSTER, "--rdzv-backend", "etcd", "--rdzv-id", "x", "--nnodes", "1"]
        cases = [
            ([], "needs --rdzv-endpoint"),
            (["--rdzv-endpoint", "a:1,a:1"], "--rdzv-endpoint for etcd"),
            (["--rdzv-endpoint", "ftp://a:1"], "--rdzv-endpoint for etcd"),
            (["--rdzv-endpoint", self.endpoints, "--rdzv-conf", "auth=munge"], "auth=munge"),
            (["--rdzv-endpoint", self.endpoints, "--rdzv-conf", "password=x"], "needs user="),
            (["--rdzv-endpoint", "https://127.0.0.1:2379"], "needs --rdzv-conf cacert"),
            (["--rdzv-endpoint", self.endpoints, "--rdzv-conf", "protocol=gopher"],
             "protocol needs http or https"),
        ]
        for extra, expected in cases:
            with self.subTest(extra=extra):
                result = run(base + extra + ["--no-python", "true"], timeout=30)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn(expected, result.stderr)

    def test_no_etcd_answers_within_join_timeout(self):
        subprocess.run([CLUSTER, "stop", self.cluster], capture_output=True, timeout=60)
        started = time.monotonic()
        agent = self.agent("lonely", nnodes="1", conf="join_timeout=3")
        code = self.wait_exit(agent, "lonely", timeout=60)
        self.assertEqual(code, 1, self.logs())
        self.assertLess(time.monotonic() - started, 30)
        self.assertIn(f"etcd at {self.endpoints}", self.read("lonely.err"))


if __name__ == "__main__":
    unittest.main()
