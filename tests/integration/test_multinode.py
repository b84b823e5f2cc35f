"""Several muster agents on loopback forming one job: the "Must work" items
1-4 of the multi-node issue, with real agents and real workers."""
import json
import shutil
import os
import signal
import subprocess
import time
import unittest

from harness import (DDP_TRAIN, MUSTER, WORKERS, TempDirTest, env, muster, reserve_port, run,
                     wait_for, worker_records)
from test_visibility import MUSTERCTL

RECORD = os.path.join(WORKERS, "record.py")



class MultiNodeTest(TempDirTest):
    def setUp(self):
        super().setUp()
        self.port = reserve_port()
        self.agents = []

    def agent(self, name, *args, nnodes="3", nproc="2", conf="", max_restarts="0", environ=None):
        """Starts one agent of job 'job' on this host; its output goes to <name>.out/.err."""
        rdzv_conf = "last_call_timeout=1,keep_alive_interval=0.5,heartbeat_timeout=3"
        if conf:
            rdzv_conf += "," + conf
        out = open(self.path(f"{name}.out"), "w")
        err = open(self.path(f"{name}.err"), "w")
        command = [MUSTER, "--nnodes", nnodes, "--nproc-per-node", nproc, "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", f"127.0.0.1:{self.port}", "--rdzv-id", "job",
                   "--rdzv-conf", rdzv_conf, "--max-restarts", max_restarts, *args]
        proc = subprocess.Popen(command, env=environ or env(), stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.addCleanup(self._reap, proc, out, err)
        self.agents.append(proc)
        return proc

    def non_host(self, procs):
        """The last agent that does not host the rendezvous."""
        hosts = [i for i in range(len(procs))
                 if "hosting the rendezvous" in self.read(f"n{i}.err")]
        self.assertEqual(len(hosts), 1, self.errors([f"n{i}" for i in range(len(procs))]))
        return [p for i, p in enumerate(procs) if i != hosts[0]][-1]

    def wait_all(self, procs, timeout=60):
        return [p.wait(timeout=timeout) for p in procs]

    def records(self):
        return worker_records(self.tmp)

    def errors(self, names):
        return "\n".join(f"--- {n}\n{self.read(n + '.err')}" for n in names)


class FormingAJob(MultiNodeTest):
    """1: three agents, unique ranks, one master; real DDP matches one node."""

    def test_three_nodes_get_unique_ranks_and_one_master(self):
        procs = [self.agent(f"n{i}", "--no-python", "/usr/bin/python3", RECORD, self.tmp)
                 for i in range(3)]
        self.assertEqual(self.wait_all(procs), [0, 0, 0], self.errors(["n0", "n1", "n2"]))
        records = self.records()
        self.assertEqual(sorted(r[2] for r in records), [0, 1, 2, 3, 4, 5])
        self.assertEqual({r[1] for r in records}, {6})
        masters = {(r[3]["MASTER_ADDR"], r[3]["MASTER_PORT"]) for r in records}
        self.assertEqual(len(masters), 1, masters)
        self.assertEqual({r[3]["GROUP_WORLD_SIZE"] for r in records}, {"3"})
        self.assertEqual(sorted({r[3]["GROUP_RANK"] for r in records}), ["0", "1", "2"])
        for _, _, rank, e in records:
            self.assertEqual(int(e["RANK"]), int(e["GROUP_RANK"]) * 2 + int(e["LOCAL_RANK"]))

    def test_ddp_across_three_nodes_matches_one_node(self):
        procs = [self.agent(f"n{i}", DDP_TRAIN, "--epochs", "1", "--out", self.path("multi.json"))
                 for i in range(3)]
        self.assertEqual(self.wait_all(procs, timeout=120), [0, 0, 0],
                         self.errors(["n0", "n1", "n2"]))
        single = muster("--standalone", "--nproc-per-node", "6", DDP_TRAIN, "--epochs", "1",
                        "--out", self.path("single.json"))
        self.assertEqual(single.returncode, 0, single.stderr)
        multi = json.loads(self.read("multi.json"))
        self.assertEqual(multi["world_size"], 6)
        self.assertEqual(multi["params"], json.loads(self.read("single.json"))["params"])


class StaticBackend(MultiNodeTest):
    """No rendezvous: ranks from --node-rank, master from the command line."""

    def test_two_static_nodes(self):
        master_port = reserve_port()
        procs = []
        for i in range(2):
            out = open(self.path(f"n{i}.out"), "w")
            err = open(self.path(f"n{i}.err"), "w")
            proc = subprocess.Popen(
                [MUSTER, "--nnodes", "2", "--nproc-per-node", "2", "--node-rank", str(i),
                 "--master-addr", "127.0.0.1", "--master-port", str(master_port), "--no-python",
                 "/usr/bin/python3", RECORD, self.tmp],
                env=env(), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                start_new_session=True)
            self.addCleanup(self._reap, proc, out, err)
            procs.append(proc)
        self.assertEqual(self.wait_all(procs), [0, 0], self.errors(["n0", "n1"]))
        records = self.records()
        self.assertEqual(sorted(r[2] for r in records), [0, 1, 2, 3])
        self.assertEqual({r[1] for r in records}, {4})
        self.assertEqual({(r[3]["MASTER_ADDR"], r[3]["MASTER_PORT"]) for r in records},
                         {("127.0.0.1", str(master_port))})
        for _, _, rank, e in records:
            self.assertEqual(e["GROUP_RANK"], str(rank // 2))


class Restarts(MultiNodeTest):
    """2: one failure restarts every node, with one job-wide count."""

    def test_failure_on_one_node_restarts_all(self):
        procs = [self.agent(f"n{i}", "--no-python", "/usr/bin/python3", RECORD, self.tmp,
                            "--fail-rank", "5", max_restarts="1") for i in range(3)]
        self.assertEqual(self.wait_all(procs), [0, 0, 0], self.errors(["n0", "n1", "n2"]))
        second = [r for r in self.records() if r[0] == 1]
        self.assertEqual(sorted(r[2] for r in second), [0, 1, 2, 3, 4, 5])
        self.assertEqual({r[3]["TORCHELASTIC_RESTART_COUNT"] for r in second}, {"1"})

    def test_restarts_exhausted_every_agent_names_the_same_root_cause(self):
        procs = [self.agent(f"n{i}", "--no-python", "/usr/bin/python3", RECORD, self.tmp,
                            "--seconds", "5", "--fail-rank", "5", "--fail-times", "5",
                            max_restarts="1") for i in range(3)]
        self.assertEqual(self.wait_all(procs), [1, 1, 1], self.errors(["n0", "n1", "n2"]))
        for name in ("n0", "n1", "n2"):
            err = self.read(f"{name}.err")
            self.assertRegex(err, r"rank 5 on \S+ (failed with )?\(?exit code 1", name + ":\n" + err)
            # Its report names rank 5 as the root cause: in its own table, or as another node's.
            self.assertRegex(err, r"(\* 5 \(1\)|Root cause on another node: rank 5 on \S+ \(exit code 1\))",
                             name + ":\n" + err)


    def test_a_node_slow_to_stop_keeps_its_seat_in_the_restart_round(self):
        # No last call: without the stop allowance each agent tells the
        # rendezvous, the round after the failure would form at once without
        # the node whose rank 5 takes 1.5 s to stop, and another would open
        # for it. Rank 0 fails once all three run (round 0 may have formed
        # with two, and grown).
        procs = [self.agent(f"n{i}", "--shutdown-timeout", "3", "--no-python", "/usr/bin/python3",
                            RECORD, self.tmp, "--seconds", "4", "--fail-rank", "0",
                            "--fail-world", "6", "--slow-stop-rank", "5",
                            "--slow-stop-seconds", "1.5",
                            nnodes="2:3", conf="last_call_timeout=0", max_restarts="1")
                 for i in range(3)]
        self.assertEqual(self.wait_all(procs), [0, 0, 0], self.errors(["n0", "n1", "n2"]))
        after = [r for r in self.records() if r[0] == 1]
        self.assertEqual({r[1] for r in after}, {6}, self.errors(["n0", "n1", "n2"]))
        self.assertEqual(sorted(r[2] for r in after), [0, 1, 2, 3, 4, 5])


class Elastic(MultiNodeTest):
    """3: a job of 2:3 nodes starts with two and grows to three without a restart."""

    def test_third_node_joins_a_running_job(self):
        a = self.agent("n0", "--no-python", "/usr/bin/python3", RECORD, self.tmp, "--seconds", "30",
                       nnodes="2:3")
        b = self.agent("n1", "--no-python", "/usr/bin/python3", RECORD, self.tmp, "--seconds", "30",
                       nnodes="2:3")
        started = wait_for(lambda: len([r for r in self.records() if r[1] == 4]) == 4, timeout=30)
        self.assertTrue(started, self.errors(["n0", "n1"]))
        c = self.agent("n2", "--no-python", "/usr/bin/python3", RECORD, self.tmp, "--seconds", "1",
                       nnodes="2:3")
        grown = wait_for(lambda: len([r for r in self.records() if r[1] == 6]) == 6, timeout=30)
        self.assertTrue(grown, self.errors(["n0", "n1", "n2"]))
        six = [r for r in self.records() if r[1] == 6]
        self.assertEqual(sorted(r[2] for r in six), [0, 1, 2, 3, 4, 5])
        self.assertEqual({r[3]["TORCHELASTIC_RESTART_COUNT"] for r in six}, {"0"})
        self.assertEqual(self.wait_all([a, b, c]), [0, 0, 0], self.errors(["n0", "n1", "n2"]))


    def test_a_spare_of_a_job_that_succeeds_exits_0(self):
        # Two seats, three agents: the third waits, and the job succeeds
        # without it. A Slurm step fails if any task exits non-zero.
        procs = [self.agent(f"n{i}", "--no-python", "/usr/bin/python3", RECORD, self.tmp,
                            "--seconds", "3", nnodes="2:2") for i in range(2)]
        started = wait_for(lambda: len([r for r in self.records() if r[1] == 4]) == 4, timeout=30)
        self.assertTrue(started, self.errors(["n0", "n1"]))
        spare = self.agent("n2", "--no-python", "/usr/bin/python3", RECORD, self.tmp,
                           "--seconds", "3", nnodes="2:2")
        self.assertEqual(self.wait_all([*procs, spare]), [0, 0, 0],
                         self.errors(["n0", "n1", "n2"]))
        self.assertIn("succeeded and is closed", self.read("n2.err"))


class LostNodes(MultiNodeTest):
    """4: a killed agent is noticed within heartbeat_timeout and the rest go on."""

    def test_sigkill_one_agent_the_others_reform(self):
        procs = [self.agent(f"n{i}", "--no-python", "/usr/bin/python3", RECORD, self.tmp,
                            "--seconds", "20", nnodes="2:3") for i in range(3)]
        started = wait_for(lambda: len([r for r in self.records() if r[1] == 6]) == 6, timeout=30)
        self.assertTrue(started, self.errors(["n0", "n1", "n2"]))
        # The agent hosting the rendezvous must live (as with torchrun's c10d);
        # any other may die.
        victim = self.non_host(procs)
        victim.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        victim.wait(timeout=10)
        reformed = wait_for(lambda: len([r for r in self.records() if r[1] == 4]) == 4, timeout=30)
        elapsed = time.monotonic() - killed_at
        self.assertTrue(reformed, self.errors(["n0", "n1"]))
        # heartbeat_timeout is 3 s; the issue allows one more second.
        self.assertLess(elapsed, 3 + 1 + 1.5, "re-forming took too long")
        four = [r for r in self.records() if r[1] == 4]
        self.assertEqual(sorted(r[2] for r in four), [0, 1, 2, 3])
        self.assertEqual({r[3]["TORCHELASTIC_RESTART_COUNT"] for r in four}, {"0"})
        survivors = [p for p in procs if p is not victim]
        for p in survivors:
            p.send_signal(signal.SIGTERM)
        self.assertEqual(self.wait_all(survivors), [143, 143], self.errors(["n0", "n1", "n2"]))

    def test_with_ha_0_the_host_killed_the_others_stop_with_a_clear_error(self):
        # ha=0: the rendezvous lives in the hosting agent alone (OwnEtcd has the default).
        procs = [self.agent(f"n{i}", "--no-python", "/usr/bin/python3", RECORD, self.tmp,
                            "--seconds", "30", nnodes="2:3", conf="ha=0") for i in range(3)]
        started = wait_for(lambda: len([r for r in self.records() if r[1] == 6]) == 6, timeout=30)
        self.assertTrue(started, self.errors(["n0", "n1", "n2"]))
        host = next(i for i in range(3) if "hosting the rendezvous" in self.read(f"n{i}.err"))
        procs[host].send_signal(signal.SIGKILL)
        others = [i for i in range(3) if i != host]
        # keep_alive_interval 0.5 s x keep_alive_max_attempt 3, then the grace to stop workers.
        codes = self.wait_all([procs[i] for i in others], timeout=15)
        self.assertEqual(codes, [1, 1], self.errors([f"n{i}" for i in others]))
        for i in others:
            self.assertIn(f"rendezvous at 127.0.0.1:{self.port} did not answer",
                          self.read(f"n{i}.err"))

    def test_below_min_waits_then_fails_naming_the_missing_node(self):
        procs = [self.agent(f"n{i}", "--no-python", "/usr/bin/python3", RECORD, self.tmp,
                            "--seconds", "30", nnodes="3", conf="join_timeout=4")
                 for i in range(3)]
        started = wait_for(lambda: len([r for r in self.records() if r[1] == 6]) == 6, timeout=30)
        self.assertTrue(started, self.errors(["n0", "n1", "n2"]))
        victim = self.non_host(procs)
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        survivors = [i for i, p in enumerate(procs) if p is not victim]
        codes = self.wait_all([procs[i] for i in survivors], timeout=30)
        names = [f"n{i}" for i in survivors]
        self.assertEqual(codes, [1, 1], self.errors(names))
        for name in names:
            err = self.read(f"{name}.err")
            self.assertIn("join timeout", err)
            self.assertIn("(lost)", err)


class HostingAgentLimits(MultiNodeTest):
    """The agent that hosts the rendezvous holds a connection per node: it
    raises its open-file limit to the hard one; its workers get the limit
    the user gave, and the files it writes are the user's alone."""

    def test_host_raises_its_limit_and_workers_get_the_one_given(self):
        probe = ('ulimit -n > "$0/limits"; grep "Max open files" /proc/$PPID/limits >> "$0/limits";'
                 ' echo to-the-log')
        command = ["prlimit", "--nofile=512:4096", MUSTER, "--nnodes", "1", "--nproc-per-node",
                   "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.port}",
                   "--rdzv-id", "job", "--log-dir", self.path("logs"), "--redirects", "3",
                   "--no-python", "/bin/sh", "-c", probe, self.tmp]
        r = subprocess.run(command, env=env(), capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("hosting the rendezvous", r.stderr)
        worker_limit, agent_line = self.read("limits").splitlines()
        self.assertEqual(worker_limit, "512")
        self.assertEqual(agent_line.split()[3:5], ["4096", "4096"], agent_line)
        logs = [os.path.join(d, f) for d, _, files in os.walk(self.path("logs")) for f in files]
        self.assertTrue(any(f.endswith("stdout.log") for f in logs), logs)
        for path in logs + [os.path.dirname(f) for f in logs]:
            self.assertEqual(os.stat(path).st_mode & 0o077, 0, f"{path} is open to others")


@unittest.skipIf(not shutil.which("etcd"), "needs etcd (scripts/setup installs etcd-server)")
class OwnEtcd(MultiNodeTest):
    """The default where etcd is installed (ha), on one host: the first agent
    to take the port starts the job's etcd, the others ask the port what it
    serves and become its members and clients. Without etcd on PATH, host
    mode says once that the job will not outlive its host (ha=1: refused,
    saying what to do); a node whose ha disagrees with the host's is refused."""

    def test_three_agents_on_one_host_share_the_first_ones_etcd(self):
        procs = [self.agent(f"n{i}", "--no-python", "/usr/bin/python3", RECORD, self.tmp,
                            "--seconds", "12") for i in range(3)]
        self.assertEqual(self.wait_all(procs, timeout=90), [0, 0, 0],
                         self.errors(["n0", "n1", "n2"]))
        self.assertEqual(sorted(r[2] for r in self.records()), [0, 1, 2, 3, 4, 5])
        logs = [self.read(f"n{i}.err") for i in range(3)]
        self.assertEqual(sum("hosting the rendezvous" in log for log in logs), 1, "\n".join(logs))
        self.assertEqual(sum("is seated in the job's etcd cluster" in log for log in logs), 2,
                         "\n".join(logs))

    def test_with_a_token_the_jobs_etcd_refuses_whoever_lacks_it(self):
        token = self.path("token")
        fd = os.open(token, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("0123456789abcdef0123456789abcdef\n")
        procs = [self.agent(f"n{i}", "--no-python", "/usr/bin/python3", RECORD, self.tmp,
                            "--seconds", "8", nnodes="2", conf=f"token_file={token}")
                 for i in range(2)]
        self.assertTrue(wait_for(lambda: len(self.records()) == 4, timeout=30),
                        self.errors(["n0", "n1"]))
        etcdctl = ["etcdctl", "--endpoints", f"127.0.0.1:{self.port}", "--dial-timeout=2s",
                   "--command-timeout=3s", "get", "/muster/", "--prefix", "--keys-only"]
        environ = {**env(), "ETCDCTL_API": "3"}
        anyone = subprocess.run(etcdctl, capture_output=True, text=True, timeout=20, env=environ)
        self.assertNotEqual(anyone.returncode, 0, anyone.stdout)
        self.assertNotIn("/muster/v1/jobs/job/", anyone.stdout)
        holder = subprocess.run(etcdctl + ["--user", "root:0123456789abcdef0123456789abcdef"],
                                capture_output=True, text=True, timeout=20, env=environ)
        self.assertEqual(holder.returncode, 0, holder.stderr)
        self.assertIn("/muster/v1/jobs/job/", holder.stdout)
        self.assertEqual(self.wait_all(procs, timeout=90), [0, 0], self.errors(["n0", "n1"]))
        self.assertNotIn("takes no credential", self.read("n0.err"))

    def test_without_etcd_on_path_the_hosting_agent_says_how_to_fix_it(self):
        environ = {**env(), "PATH": self.tmp}
        proc = self.agent("n0", "--no-python", "/bin/true", conf="ha=1", environ=environ)
        self.assertEqual(proc.wait(timeout=30), 2, self.read("n0.err"))
        self.assertIn("etcd is not on PATH: install etcd-server, or give ha=0 to every node",
                      self.read("n0.err"))

    def test_musterctl_says_it_does_not_read_the_jobs_etcd_yet(self):
        procs = [self.agent(f"n{i}", "--no-python", "/usr/bin/python3", RECORD, self.tmp,
                            "--seconds", "8", nnodes="2") for i in range(2)]
        self.assertTrue(wait_for(lambda: len(self.records()) == 4, timeout=30),
                        self.errors(["n0", "n1"]))
        result = run([MUSTERCTL, "status", "--endpoint", f"127.0.0.1:{self.port}", "job"],
                     timeout=30)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("it is a job's own etcd cluster (ha, host mode's default where etcd is "
                      "installed), which musterctl does not read yet (start the job with "
                      "--rdzv-conf ha=0", result.stderr)
        self.assertEqual(self.wait_all(procs, timeout=60), [0, 0], self.errors(["n0", "n1"]))

    def test_by_default_without_etcd_host_mode_says_once_the_job_will_not_outlive_its_host(self):
        environ = {**env(), "PATH": self.tmp}
        procs = [self.agent(f"n{i}", "--no-python", "/bin/true", nnodes="2", environ=environ)
                 for i in range(2)]
        self.assertEqual(self.wait_all(procs, timeout=60), [0, 0], self.errors(["n0", "n1"]))
        logs = "".join(self.read(f"n{i}.err") for i in range(2))
        self.assertEqual(logs.count("so the job will not outlive this node (etcd is not on PATH: "
                                    "install etcd-server"), 1, logs)
        self.assertNotIn("on the job's own etcd cluster", logs)

    def test_a_node_whose_ha_disagrees_with_the_hosts_is_refused(self):
        for host_conf, joiner_conf, refusal in [
                ("", "ha=0,is_host=0", "ha=0 on this node, but the rendezvous host at "
                                       f"127.0.0.1:{self.port} keeps the job on an etcd cluster"),
                ("ha=0", "ha=1,is_host=0", "ha=1 on this node, but the rendezvous host at "
                                           f"127.0.0.1:{self.port} runs host mode without it")]:
            with self.subTest(host=host_conf, joiner=joiner_conf):
                host = self.agent("host", "--no-python", "/bin/true", nnodes="2", conf=host_conf)
                self.assertTrue(wait_for(lambda: "hosting the rendezvous" in self.read("host.err"),
                                         timeout=30), self.read("host.err"))
                joiner = self.agent("joiner", "--no-python", "/bin/true", nnodes="2",
                                    conf=joiner_conf)
                self.assertEqual(joiner.wait(timeout=30), 2, self.read("joiner.err"))
                self.assertIn(refusal, self.read("joiner.err"))
                self.assertIn("give every node the same ha, or none", self.read("joiner.err"))
                host.send_signal(signal.SIGTERM)
                self.assertEqual(host.wait(timeout=30), 143, self.read("host.err"))


if __name__ == "__main__":
    unittest.main()
