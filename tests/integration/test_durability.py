"""The rendezvous is no single point of failure (issue 12): musterd with
--state-dir continues every job after a SIGKILL or a stop, and agents keep
their workers running while it is away. Real musterd, real agents, real
workers on loopback."""
import os
import signal
import time
import unittest

from harness import MUSTER, OnDemandWorkers, pid_alive, reserve_port, wait_for
from test_musterd import MUSTERD, SERVING, MusterdTest


class DurabilityTest(OnDemandWorkers, MusterdTest):
    """A musterd on a fixed port (so it can come back on it) and agents whose
    workers end when the test says (workers/on_demand.py)."""

    def setUp(self):
        super().setUp()
        self.port = reserve_port()
        self.state = self.path("state")
        self.work = self.path("work")
        os.makedirs(self.work)
        self.musterd_starts = 0

    def musterd(self, *extra):
        """Starts musterd on self.port with --state-dir; returns it once it serves."""
        self.musterd_starts += 1
        name = f"musterd{self.musterd_starts}"
        proc = self.spawn(name, [MUSTERD, "--listen", "127.0.0.1", "--port", str(self.port),
                                 "--state-dir", self.state, *extra])
        serving = wait_for(lambda: SERVING.search(self.read(f"{name}.out")) or
                           proc.poll() is not None, timeout=15)
        self.assertTrue(serving and proc.poll() is None, self.read(f"{name}.err"))
        return proc, name

    def agents(self, count=2, max_restarts=2):
        procs = []
        for n in range(count):
            procs.append(self.spawn(f"agent{n}", [
                MUSTER, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.port}",
                "--rdzv-id", "durable", "--nnodes", str(count), "--nproc-per-node", "1",
                "--max-restarts", str(max_restarts),
                "--rdzv-conf", "is_host=0,heartbeat_timeout=10,keep_alive_interval=1",
                "--no-python", "/usr/bin/python3", self.ON_DEMAND, self.work]))
        return procs

    def logs(self, names=("agent0", "agent1")):
        return "\n".join(f"--- {n}\n{self.read(n + '.err')}" for n in
                         [*names, *[f"musterd{i + 1}" for i in range(self.musterd_starts)]])


class MusterdRestart(DurabilityTest):
    """1 (and 3, end to end): SIGKILL musterd mid-job, start it again 3 s later on
    a journal whose tail was torn: the job goes on with the same workers, the
    same restart count, and ends with the right root cause."""

    def test_sigkill_and_restart_continue_the_job(self):
        musterd, name = self.musterd()
        self.assertIn("state: kept in", self.read(f"{name}.err"))
        agents = self.agents(max_restarts=2)
        self.pids(0)
        self.fail_rank(1, 0)  # restart 1 of 2
        before = self.pids(1)
        self.assertTrue(wait_for(lambda: all("restarts 1/2" in self.read(f"agent{n}.err")
                                             for n in range(2)), 15), self.logs())

        musterd.send_signal(signal.SIGKILL)
        musterd.wait(timeout=10)
        # As if the kill came in the middle of a write: half a record at the end.
        with open(os.path.join(self.state, "journal"), "ab") as journal:
            journal.write(b"\x40\x00\x00\x00\x12\x34")
        time.sleep(3)
        musterd, name = self.musterd()
        log = self.read(f"{name}.err")
        self.assertIn("is cut short", log)
        self.assertRegex(log, r"state: kept in \S+: 1 job\(s\) continued from it \(1 not closed\)")
        for n in range(2):
            self.assertTrue(wait_for(lambda: "answers again" in self.read(f"agent{n}.err"), 20),
                            self.logs())
        # Nobody was restarted: the same workers run, no new attempt began.
        for rank, pid in before.items():
            self.assertTrue(pid_alive(pid), f"rank {rank}'s worker was disturbed:\n{self.logs()}")
        self.assertEqual(self.attempts(), [0, 1])
        for agent in agents:
            self.assertIsNone(agent.poll(), self.logs())

        self.fail_rank(0, 1)  # restart 2 of 2: the count went on from 1
        self.pids(2)
        self.assertTrue(wait_for(lambda: all("restarts 2/2" in self.read(f"agent{n}.err")
                                             for n in range(2)), 15), self.logs())
        self.fail_rank(1, 2)  # none left
        for n, agent in enumerate(agents):
            code, err = self.finish(agent, f"agent{n}", timeout=60)
            self.assertEqual(code, 1, err)
            self.assertRegex(err, r"rank 1 on \S+ (failed with )?\(?exit code 1", err)
        self.assertRegex(self.read(f"{name}.err"),
                         r"job 'durable' closed, failed: rank 1 on \S+ failed with exit code 1; "
                         r"no restarts left \(max_restarts 2\)")
        self.assertEqual(self.attempts(), [0, 1, 2])


class LongOutage(DurabilityTest):
    """2: musterd stopped for 60 s while the workers run: no worker disturbed, no
    agent exits; it comes back and the job finishes, exit 0."""

    def test_a_minute_without_musterd(self):
        musterd, name = self.musterd()
        agents = self.agents()
        before = self.pids(0)
        musterd.send_signal(signal.SIGTERM)
        code, log = self.finish(musterd, name, timeout=10)
        self.assertEqual(code, 0, log)
        self.assertIn("every job is kept in", log)
        time.sleep(60)
        for n, agent in enumerate(agents):
            self.assertIsNone(agent.poll(), self.logs())
            err = self.read(f"agent{n}.err")
            # Said once, not once a heartbeat.
            self.assertEqual(err.count("does not answer"), 1, err)
            self.assertIn("worker(s) keep running", err)
        for rank, pid in before.items():
            self.assertTrue(pid_alive(pid), f"rank {rank}'s worker was disturbed")

        self.musterd()
        for n in range(2):
            self.assertTrue(wait_for(lambda: "answers again" in self.read(f"agent{n}.err"), 20),
                            self.logs())
        self.finish_workers()
        for n, agent in enumerate(agents):
            code, err = self.finish(agent, f"agent{n}", timeout=60)
            self.assertEqual(code, 0, err)
        self.assertEqual(self.attempts(), [0])
        self.assertIn("job 'durable' closed, succeeded", self.read("musterd2.err"))


class WithoutStateDir(DurabilityTest):
    """Without --state-dir musterd behaves as before, and says the state is not kept."""

    def test_a_restart_forgets_the_job_and_the_agents_start_it_again(self):
        musterd = self.spawn("musterd1", [MUSTERD, "--listen", "127.0.0.1", "--port",
                                          str(self.port)])
        self.musterd_starts = 1
        self.assertTrue(wait_for(lambda: SERVING.search(self.read("musterd1.out")), 15))
        self.assertIn("state: not kept", self.read("musterd1.err"))
        agents = self.agents(max_restarts=0)
        first = self.pids(0)
        musterd.send_signal(signal.SIGKILL)
        musterd.wait(timeout=10)
        time.sleep(2)
        self.spawn("musterd2", [MUSTERD, "--listen", "127.0.0.1", "--port", str(self.port)])
        self.musterd_starts = 2
        # The job is new to it: the agents say so, stop their workers and form it again.
        for n in range(2):
            self.assertTrue(wait_for(lambda: "came back without this job" in
                                     self.read(f"agent{n}.err"), 30), self.logs())
        # New workers, of a job that starts over (its count at 0 again).
        restarted = wait_for(lambda: all(p != self.pids(0)[r] for r, p in first.items()), 30)
        self.assertTrue(restarted, self.logs())
        self.finish_workers()
        for n, agent in enumerate(agents):
            code, err = self.finish(agent, f"agent{n}", timeout=60)
            self.assertEqual(code, 0, err)


if __name__ == "__main__":
    unittest.main()
