"""Hangs (issue 13): PyTorch's own watchdog (the file timer) works under
muster as under torchrun, the report shows where a killed worker was, and a
stopped agent is found and dropped. Real agents, real PyTorch workers."""
import glob
import os
import re
import shutil
import signal
import subprocess
import time
import unittest

from harness import (MUSTER, PYTHON, TORCHRUN, WORKERS, OnDemandWorkers, TempDirTest, env, muster,
                     reserve_port,
                     pid_alive,
                     read_file, run, torchrun, wait_for)
from test_musterd import MusterdTest
from test_trust import NODE_ID

FILE_TIMER = os.path.join(WORKERS, "file_timer.py")


def have_torch():
    return run([PYTHON, "-c", "import torch.distributed.elastic.timer"]).returncode == 0


@unittest.skipUnless(have_torch(), "needs Debian's python3-torch (torch.distributed.elastic.timer)")
class FileTimer(TempDirTest):
    """1 and 2: a worker whose file timer expires is killed, as torchrun kills it."""

    def setUp(self):
        super().setUp()
        self.work = self.path("work")
        os.makedirs(self.work)

    def launch(self, launcher, mode, nproc=2, max_restarts=1, **extra_env):
        args = ["--nproc-per-node" if launcher is muster else "--nproc_per_node", str(nproc),
                "--max-restarts" if launcher is muster else "--max_restarts", str(max_restarts)]
        if launcher is not muster:
            args += ["--standalone"]
        proc = launcher(*args, FILE_TIMER, mode, self.work, timeout=120,
                        TORCHELASTIC_ENABLE_FILE_TIMER="1", **extra_env)
        return proc

    def assert_killed_in_time(self, result, nproc=2):
        """Attempt 0's workers were killed within 1.5 s of their expiry (as the
        agent measured it), and attempt 1 ran."""
        late = [float(x) for x in
                re.findall(r"file timer 'train_step' of pid \d+ expired ([\d.]+) s ago; sending",
                           result.stderr)]
        self.assertEqual(len(late), nproc, result.stderr)
        self.assertLess(max(late), 1.5, result.stderr)
        for rank in range(nproc):
            pid, _ = read_file(os.path.join(self.work, f"expiry.0.{rank}")).split()
            self.assertFalse(pid_alive(int(pid)))
            self.assertTrue(os.path.exists(os.path.join(self.work, f"start.1.{rank}")))

    def test_expired_worker_is_killed_and_restarted(self):
        r = self.launch(muster, "hang")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("file timer 'train_step'", r.stderr)
        self.assertRegex(r.stderr, r"rank \d \(local rank \d, pid \d+\) failed: Signal 9 \(SIGKILL\)"
                                   r": its file timer 'train_step' expired")
        self.assert_killed_in_time(r)

    def watch_the_kill(self, argv, name):
        """Runs argv (a launcher on FILE_TIMER hang, 1 worker, 1 restart) in the
        background, watches its worker die, and returns the seconds from the
        timer's expiry to the death, once the job succeeded."""
        out = open(self.path(f"{name}.out"), "w")
        err = open(self.path(f"{name}.err"), "w")
        proc = subprocess.Popen(argv, env=env(TORCHELASTIC_ENABLE_FILE_TIMER="1"), stdout=out,
                                stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        self.addCleanup(self._reap, proc, out, err)
        path = os.path.join(self.work, "expiry.0.0")
        self.assertTrue(wait_for(lambda: os.path.exists(path), timeout=60), self.read(f"{name}.err"))
        pid, expiry = read_file(path).split()
        gone = wait_for(lambda: not pid_alive(int(pid)), timeout=30, interval=0.01)
        died = time.time()
        self.assertTrue(gone, self.read(f"{name}.err"))
        self.assertEqual(proc.wait(timeout=90), 0, self.read(f"{name}.err"))
        return died - float(expiry)

    def test_killed_within_1_5_s_of_expiry(self):
        late = self.watch_the_kill([MUSTER, "--nproc-per-node", "1", "--max-restarts", "1",
                                    FILE_TIMER, "hang", self.work], "muster")
        self.assertLess(late, 1.5, self.read("muster.err"))

    def test_same_kill_under_torchrun(self):
        late = self.watch_the_kill([PYTHON, TORCHRUN, "--standalone", "--nproc_per_node", "1",
                                    "--max_restarts", "1", FILE_TIMER, "hang", self.work],
                                   "torchrun")
        self.assertLess(late, 1.5, self.read("torchrun.err"))
        self.assertIn("exitcode: -9", self.read("torchrun.err"))

    def test_released_scope_is_never_acted_on(self):
        for launcher in (muster, torchrun):
            for f in glob.glob(os.path.join(self.work, "*")):
                os.remove(f)
            r = self.launch(launcher, "release", max_restarts=0)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertFalse(glob.glob(os.path.join(self.work, "start.1.*")))

    def test_garbage_in_the_pipe_does_not_stop_the_agent(self):
        r = self.launch(muster, "garbage")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assert_killed_in_time(r)
        self.assertIn("got a line it cannot read", r.stderr)
        self.assertIn("got a timer for pid 1, which is not one of this node's workers", r.stderr)
        counts = re.search(r"got (\d+) line\(s\) it could not read and (\d+) for a pid", r.stderr)
        self.assertTrue(counts, r.stderr)
        # Two workers wrote 5 bad lines and 1 foreign one each.
        self.assertEqual((int(counts.group(1)), int(counts.group(2))), (10, 2), r.stderr)
        self.assertTrue(pid_alive(1))

    def test_report_shows_where_it_hung(self):
        """3: the report of the killed worker shows its stacks, native and
        Python (or says why there are none), and the log dir keeps them."""
        r = self.launch(muster, "hang", nproc=1, max_restarts=0)
        self.assertEqual(r.returncode, 1, r.stderr)
        root = r.stderr[r.stderr.index("Root Cause"):]
        self.assertIn("muster killed it: its file timer 'train_step' expired", root)
        stack_file = re.search(r"stacks    : (\S+/attempt_0/0/stack\.txt)\n", root)
        self.assertTrue(stack_file, root)
        self.assertIn("native frames (eu-stack):", root)
        self.assertRegex(root, r"TID \d+:\n\s+#0 ")
        self.assertRegex(root, r"#\d+ +0x[0-9a-f]+ \S*(clock_nanosleep|time_sleep)")
        python = re.search(r"Python frames \(gdb\):\n(.*?)\n=", root, re.S)
        self.assertTrue(python, root)
        frames = re.search(r'Python thread 1 \(TID \d+\):\n\s+File "' + re.escape(FILE_TIMER) +
                           r'", line \d+, in <module>', python.group(1))
        why_not = re.search(r"not available: \S|not finished in time|not taken: out of time",
                            python.group(1))
        self.assertTrue(frames or why_not, python.group(1))
        saved = read_file(stack_file.group(1))
        self.assertIn("native frames (eu-stack):", saved)
        self.assertIn("Python frames (gdb):", saved)

    def test_given_path_is_used_and_private(self):
        pipe = self.path("my-timer")
        open(pipe, "w").close()
        r = self.launch(muster, "release", max_restarts=0, TORCHELASTIC_TIMER_FILE=pipe)
        self.assertEqual(r.returncode, 1)
        self.assertIn("exists and is not a named pipe", r.stderr)
        os.remove(pipe)
        proc = self.start("--nproc-per-node", "1", FILE_TIMER, "release", self.work,
                          TORCHELASTIC_ENABLE_FILE_TIMER="1", TORCHELASTIC_TIMER_FILE=pipe)
        self.assertTrue(wait_for(lambda: os.path.exists(os.path.join(self.work, "start.0.0")),
                                 timeout=60), self.read("muster.err"))
        mode = os.stat(pipe).st_mode
        self.assertEqual(oct(mode & 0o777), oct(0o600))
        self.assertEqual(proc.wait(timeout=60), 0, self.read("muster.err"))
        self.assertFalse(os.path.exists(pipe), "the pipe is removed at the end")

    def test_own_pipe_is_in_a_private_directory(self):
        proc = self.start("--nproc-per-node", "1", FILE_TIMER, "release", self.work,
                          TORCHELASTIC_ENABLE_FILE_TIMER="1")
        found = wait_for(lambda: re.search(r"serving torch's file timer at (\S+)",
                                           self.read("muster.err")), timeout=30)
        self.assertTrue(found, self.read("muster.err"))
        pipe = found.group(1)
        self.assertEqual(oct(os.stat(pipe).st_mode & 0o777), oct(0o600))
        self.assertEqual(oct(os.stat(os.path.dirname(pipe)).st_mode & 0o777), oct(0o700))
        self.assertEqual(proc.wait(timeout=60), 0, self.read("muster.err"))
        self.assertFalse(os.path.exists(os.path.dirname(pipe)))


if __name__ == "__main__":
    unittest.main()


class HungWorker(TempDirTest):
    """3, at the end of the grace: a worker that ignores SIGTERM has its stacks
    taken before the SIGKILL, with its Python frames when gdb and CPython's
    extension are installed (scripts/setup installs them)."""

    STUCK = os.path.join(WORKERS, "stuck.py")

    def test_stacks_are_taken_before_the_sigkill(self):
        r = muster("--nproc-per-node", "2", "--shutdown-timeout", "1", "--no-python", PYTHON,
                   self.STUCK)
        self.assertEqual(r.returncode, 1, r.stderr)
        said = re.search(r"rank 1 \(pid (\d+)\) did not stop: its stacks are in (\S+)", r.stderr)
        self.assertTrue(said, r.stderr)
        self.assertIn("did not stop within the grace; its stacks: " + said.group(2), r.stderr)
        saved = read_file(said.group(2))
        self.assertIn(f"stacks of rank 1 (local rank 1, pid {said.group(1)})", saved)
        self.assertRegex(saved, r"native frames \(eu-stack\):\nPID \d+ - process\nTID \d+:\n#0 ")
        python = saved[saved.index("Python frames (gdb):"):]
        if have_py_bt():
            self.assertTrue(f'File "{self.STUCK}", line' in python and "in wait_forever" in python
                            or "not finished in time" in python, python)
        else:
            self.assertIn("not available:", python)


def have_py_bt():
    """gdb and CPython's gdb extension for Debian's interpreter."""
    version = run([PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]).stdout.strip()
    return (shutil.which("gdb") is not None and
            os.path.exists(f"/usr/share/gdb/auto-load/usr/bin/python{version}-gdb.py"))


class StoppedAgent(OnDemandWorkers, MusterdTest):
    """4: an agent stopped with SIGSTOP answers no ping: its node is dropped and
    the others re-form within heartbeat_timeout + 5 s; continued, it learns it
    was dropped, and leaves no worker behind."""

    HEARTBEAT = 4

    def setUp(self):
        super().setUp()
        self.work = self.path("work")
        os.makedirs(self.work)

    def logs(self):
        return "\n".join(f"--- {n}\n{self.read(n + '.err')}"
                         for n in ("musterd", "agent0", "agent1", "agent2")
                         if os.path.exists(self.path(n + ".err")))

    def agent(self, n, endpoint, *conf):
        # At debug level an agent logs its node id, which the outsider below names.
        return self.spawn(f"agent{n}", [
            MUSTER, "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "stopped",
            "--nnodes", "2:3", "--nproc-per-node", "1", "--max-restarts", "3",
            "--rdzv-conf", ",".join([f"heartbeat_timeout={self.HEARTBEAT}", "keep_alive_interval=1",
                                     "last_call_timeout=1", *conf]),
            "--no-python", PYTHON, self.ON_DEMAND, self.work], MUSTER_LOG_LEVEL="debug")

    def check_stop_and_continue(self, agents, stopped, while_stopped=lambda: None):
        first = self.pids(0, ranks=3)
        os.kill(agents[stopped].pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        # The two others start round 1 once the stopped node is dropped.
        others = [f"agent{n}" for n in range(len(agents)) if n != stopped]
        started = wait_for(lambda: all("round 1: started" in self.read(f"{name}.err")
                                       for name in others), timeout=self.HEARTBEAT + 30)
        reformed = time.monotonic() - stopped_at
        self.assertTrue(started, self.logs())
        self.assertLess(reformed, self.HEARTBEAT + 5, self.logs())
        while_stopped()
        time.sleep(1)
        os.kill(agents[stopped].pid, signal.SIGCONT)
        return first

    def test_stopped_agent_is_dropped_on_musterd(self):
        musterd, port = self.start_musterd("--ping-interval", "1", "--ping-timeout", "1")
        agents = [self.agent(n, f"127.0.0.1:{port}", "is_host=0") for n in range(3)]

        def outsider_asks():
            # Naming the dropped node without its secret tells an outsider nothing of why.
            node = NODE_ID.search(self.read("agent2.err")).group(1)
            for method in ("Heartbeat", "Watch"):
                code, message, _ = self.call(port, method, {"jobId": "stopped", "nodeId": node})
                self.assertEqual((code, message),
                                 ("NOT_FOUND", f"node {node} is not part of job 'stopped'"))

        first = self.check_stop_and_continue(agents, stopped=2, while_stopped=outsider_asks)
        # Continued, it learns why, stops its old worker and rejoins: the job
        # grows back to 3 nodes. Told by the rendezvous, or by its peers when
        # its keepalive watchdog fires first (a slow tree).
        said = wait_for(lambda: re.search(r"was dropped from job 'stopped': node|is in round \d+ "
                                          r"already: the rendezvous dropped this node",
                                          self.read("agent2.err")), timeout=30)
        self.assertTrue(said, self.logs())
        self.assertIn("this agent did not run for", self.read("agent2.err"))
        regrown = wait_for(lambda: all(re.search(r"round \d+: started 1 worker\(s\), ranks \d of "
                                                 r"world size 3", self.read(f"agent{n}.err"))
                                       for n in (2,)), timeout=30)
        self.assertTrue(regrown, self.logs())
        for pid in first.values():
            self.assertTrue(wait_for(lambda: not pid_alive(pid), timeout=10), self.logs())
        self.finish_workers()
        for n, agent in enumerate(agents):
            self.assertEqual(agent.wait(timeout=60), 0, self.logs())

    def test_stopped_agent_is_dropped_by_a_hosting_agent(self):
        """The hosting agent's server (ha=0) pings a third and a sixth of heartbeat_timeout."""
        self.stopped_agent_is_dropped_in_host_mode("was dropped from job 'stopped': node", "ha=0")

    def test_stopped_agent_is_dropped_from_the_jobs_own_etcd(self):
        """By default (ha), its lease runs out; its etcd member, not stopped, keeps serving."""
        if not shutil.which("etcd"):
            self.skipTest("needs etcd (scripts/setup installs etcd-server)")
        self.stopped_agent_is_dropped_in_host_mode(
            r"the rendezvous dropped this node \(node .* is not part of job 'stopped'\)")

    def stopped_agent_is_dropped_in_host_mode(self, dropped, *conf):
        """`dropped`: what the stopped agent says, continued (a regular expression)."""
        port = reserve_port()
        agents = [self.agent(n, f"127.0.0.1:{port}", *conf) for n in range(3)]
        self.pids(0, ranks=3)
        hosts = [n for n in range(3) if "hosting the rendezvous" in self.read(f"agent{n}.err")]
        self.assertEqual(len(hosts), 1, self.logs())
        stopped = [n for n in range(3) if n != hosts[0]][-1]
        self.check_stop_and_continue(agents, stopped)
        said = wait_for(lambda: re.search(dropped, self.read(f"agent{stopped}.err")), timeout=30)
        self.assertTrue(said, self.logs())
        self.finish_workers()
        for agent in agents:
            self.assertEqual(agent.wait(timeout=60), 0, self.logs())
