"""Restarting wisely (issue 32), with real agents and workers: progress
reported through MUSTER_PROGRESS_FILE, a job that makes no progress stopped
with its own exit code, and a bad node excluded so that the spare takes its
seat. The nodes are hosts of their own: each agent runs in a UTS namespace
with its own host name (unshare -u), on loopback, against a real musterd."""
import glob
import json
import os
import shutil
import signal

from harness import MUSTER, WORKERS, TempDirTest, muster, read_file, run, wait_for
from test_gpu_check import FAKE_NVML
from test_trust import TrustTest
from test_visibility import MUSTERCTL, Scraping

PROGRESS = os.path.join(WORKERS, "progress.py")
# agent/exit_codes.h
EXIT_NODE_EXCLUDED, EXIT_NO_PROGRESS, EXIT_FAILED_AFTER_PROGRESS = 69, 70, 75


def marks(directory, kind):
    """(host, restart, rank) of each DIR/<kind>.<host>.<restart>.<rank> a worker wrote."""
    out = set()
    for path in glob.glob(os.path.join(directory, f"{kind}.*")):
        _, host, restart, rank = os.path.basename(path).split(".")
        out.add((host, int(restart), int(rank)))
    return out


class NoProgress(TempDirTest):
    """--max-no-progress-restarts (issue 32, "Must work" 5), one node."""

    def launch(self, mode, *extra):
        work = self.path(mode)
        os.makedirs(work)
        result = muster("--standalone", "--nproc-per-node", "1", "--max-restarts", "10", *extra,
                        PROGRESS, mode, work, timeout=120)
        return result, work

    def test_a_script_that_fails_at_step_zero_every_time_stops_after_k_restarts(self):
        result, work = self.launch("stuck", "--max-no-progress-restarts", "2")
        self.assertEqual(result.returncode, EXIT_NO_PROGRESS, result.stderr)
        # Round 0, then restarts 1 and 2 reached no new step: stopped, not 10 restarts.
        self.assertEqual(sorted(r for _, r, _ in marks(work, "start")), [0, 1, 2])
        self.assertIn("2 restart(s) in a row reached no new step", result.stderr)
        self.assertIn("does the script write MUSTER_PROGRESS_FILE?", result.stderr)
        self.assertIn("exit code 70: stuck, do not requeue", result.stderr)

    def test_a_script_that_fails_after_new_steps_uses_every_restart(self):
        result, work = self.launch("advance", "--max-no-progress-restarts", "2")
        self.assertEqual(result.returncode, EXIT_FAILED_AFTER_PROGRESS, result.stderr)
        self.assertEqual(sorted(r for _, r, _ in marks(work, "start")), list(range(11)))
        self.assertIn("no restarts left", result.stderr)
        # The last round wrote steps 101..105; the last is read as the failure comes.
        self.assertIn("the job's last step: 105", result.stderr)
        self.assertIn("a requeue resumes it", result.stderr)

    def test_without_the_rule_a_stuck_script_fails_as_under_torchrun(self):
        result, work = self.launch("stuck", "--max-restarts", "2")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(len(marks(work, "start")), 3)


class BadNodes(TrustTest, Scraping):
    """A node whose workers fail at every start is excluded after
    --max-node-failures failures, and the spare takes its seat (issue 32,
    "Must work" 1 and 6): three agents on hosts nodeA, nodeB and nodeC,
    --nnodes 2, musterd between them."""

    JOB = "bad-nodes"

    def setUp(self):
        super().setUp()
        self.work = self.path("work")
        os.makedirs(self.work)
        self.token = self.token_file()
        self.musterd, self.port = self.start_musterd("--token-file", self.token,
                                                     "--metrics-port", "0")
        self.names = ["musterd"]

    def logs(self):
        return "\n".join(f"--- {name}\n{self.read(name + '.err')}" for name in self.names)

    def start_on(self, host, name=None, *extra, bad="nodeA", nnodes="2", restarts="5",
                 **extra_env):
        """An agent on host `host` (its own UTS namespace) whose workers fail on host `bad`."""
        name = name or host
        self.names.append(name)
        return self.spawn(name, [
            "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host,
            MUSTER, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.port}",
            "--rdzv-id", self.JOB, "--nnodes", nnodes, "--nproc-per-node", "1",
            "--max-restarts", restarts, "--max-node-failures", "2",
            "--rdzv-conf", "is_host=0,metrics_port=0", *extra,
            PROGRESS, "bad-host", bad, self.work], MUSTER_TOKEN_FILE=self.token, **extra_env)

    def fake_gpu(self, host):
        """The environment of an agent whose node has one GPU, as the fake NVML
        shows it from its own directory."""
        directory = self.path(f"nvml-{host}")
        os.makedirs(os.path.join(directory, "pids"))
        with open(os.path.join(directory, "count"), "w") as f:
            f.write("1")
        return {"MUSTER_NVML_LIBRARY": FAKE_NVML, "FAKE_NVML_DIR": directory}

    def ctl(self, *args):
        return run([MUSTERCTL, args[0], "--endpoint", f"127.0.0.1:{self.port}", *args[1:]],
                   timeout=30, MUSTER_TOKEN_FILE=self.token)

    def status(self):
        result = self.ctl("status", self.JOB, "--json")
        self.assertIn(result.returncode, (0, 1), result.stderr)
        return json.loads(result.stdout)

    def test_the_bad_node_is_excluded_and_the_spare_finishes_the_job(self):
        hook = self.path("excluded.txt")
        a = self.start_on("nodeA", None, "--on-node-excluded",
                          f'echo "$MUSTER_EXCLUDED_HOST: $MUSTER_EXCLUSION_CAUSE" > {hook}')
        b = self.start_on("nodeB")
        started = wait_for(lambda: {("nodeA", 0, 0), ("nodeB", 0, 1)} <= marks(self.work, "start")
                           or {("nodeA", 0, 1), ("nodeB", 0, 0)} <= marks(self.work, "start"), 60)
        self.assertTrue(started, self.logs())
        c = self.start_on("nodeC")  # the spare

        # nodeA fails twice in a row: excluded, its agent exits with the cause.
        code, err = self.finish(a, "nodeA")
        self.assertEqual(code, EXIT_NODE_EXCLUDED, self.logs())
        self.assertIn("is excluded from the job: its workers were the root cause of 2 failures",
                      err)
        self.assertIn("nodeA: its workers were the root cause of 2 failures", read_file(hook))
        # The spare is seated in its place, the restart count at the failures seen.
        final = lambda: {h for h, r, _ in marks(self.work, "start") if r == 2} == {"nodeB", "nodeC"}
        self.assertTrue(wait_for(final, 60), self.logs())
        self.assertEqual({h for h, _, _ in marks(self.work, "start")}, {"nodeA", "nodeB", "nodeC"})
        self.assertEqual({r for h, r, _ in marks(self.work, "start") if h == "nodeA"}, {0, 1})

        # While it runs: the job's step, its pace, its goodput and the exclusion.
        trains = lambda: self.status().get("steps_per_second", 0) > 0
        self.assertTrue(wait_for(trains, 30, interval=0.5), self.logs())
        job = self.status()
        self.assertEqual((job["state"], job["round"], job["restarts"]), ("running", 2, 2), job)
        self.assertGreater(job["step"], 0, job)
        self.assertTrue(0 < job["goodput"] <= 1, job)
        self.assertEqual([e["host"] for e in job["excluded"]], ["nodeA"], job)
        self.assertIn("root cause of 2 failures", job["excluded"][0]["cause"])
        self.assertTrue(all(n["step"] > 0 for n in job["node_list"]), job)
        table = self.ctl("status", self.JOB)
        self.assertRegex(table.stdout, r"step \d+, [0-9.e+]+ steps/s, last step \d+s ago; goodput")
        self.assertIn("excluded: nodeA", table.stdout)
        if shutil.which("promtool") is not None:
            labels = (("job_id", self.JOB),)
            server = self.scrape("musterd")
            self.assertEqual(server[("muster_rendezvous_job_excluded_nodes", labels)], 1)
            self.assertGreater(server[("muster_rendezvous_job_step", labels)], 0)
            self.assertGreater(server[("muster_rendezvous_job_goodput_ratio", labels)], 0)
            agent = self.scrape("nodeB")
            self.assertGreater(agent[("muster_agent_step", labels)], 0)
            self.assertGreater(agent[("muster_agent_steps_per_second", labels)], 0)

        # nodeA comes back under a new agent: refused, with the reason.
        again = self.start_on("nodeA", "nodeA-again")
        code, err = self.finish(again, "nodeA-again")
        self.assertEqual(code, EXIT_NODE_EXCLUDED, err)
        self.assertIn("is excluded from job", err)
        self.assertIn("root cause of 2 failures", err)

        open(os.path.join(self.work, "finish"), "w").close()
        for proc, name in ((b, "nodeB"), (c, "nodeC")):
            code, err = self.finish(proc, name)
            self.assertEqual(code, 0, self.logs())
        self.assertEqual({(h, r) for h, r, _ in marks(self.work, "done")},
                         {("nodeB", 2), ("nodeC", 2)})
        self.assertEqual(self.status()["restarts"], 2, "restarts spent = failures seen")

    def test_a_bad_node_excluded_by_the_last_restart_ends_as_the_job_does(self):
        """The failure that excludes nodeA leaves no restart: the job closes,
        and every agent exits 1 (not 69: the job did not go on without it);
        --on-node-excluded still runs for the admin."""
        hook = self.path("excluded.txt")
        a = self.start_on("nodeA", None, "--on-node-excluded",
                          f'echo "$MUSTER_EXCLUDED_HOST" > {hook}', restarts="1")
        b = self.start_on("nodeB", restarts="1")
        for proc, name in ((a, "nodeA"), (b, "nodeB")):
            code, err = self.finish(proc, name)
            self.assertEqual(code, 1, self.logs())
            self.assertIn("no restarts left (max_restarts 1)", err)
        self.assertIn("the same failure ends the job", self.read("nodeA.err"))
        self.assertEqual(read_file(hook).strip(), "nodeA")
        self.assertRegex(self.read("nodeB.err"), r"hosts? excluded: nodeA")

    def test_a_gpu_that_falls_off_the_bus_excludes_its_node_and_the_spare_takes_over(self):
        """Issue 32, "Must work" 2: an Xid 79 on node B's GPU."""
        gpus = {host: self.fake_gpu(host) for host in ("nodeA", "nodeB", "nodeC")}
        check = ("--gpu-check-interval", "1")
        a = self.start_on("nodeA", None, *check, bad="none", **gpus["nodeA"])
        b = self.start_on("nodeB", None, *check, bad="none", **gpus["nodeB"])
        started = lambda: {h for h, r, _ in marks(self.work, "start") if r == 0} == {"nodeA",
                                                                                    "nodeB"}
        self.assertTrue(wait_for(started, 60), self.logs())
        c = self.start_on("nodeC", None, *check, bad="none", **gpus["nodeC"])
        self.assertTrue(wait_for(lambda: self.status()["waiting"] == 1, 30), self.logs())

        with open(os.path.join(gpus["nodeB"]["FAKE_NVML_DIR"], "xid.0"), "w") as f:
            f.write("79")
        code, err = self.finish(b, "nodeB")
        self.assertEqual(code, EXIT_NODE_EXCLUDED, self.logs())
        self.assertIn("this node is bad: GPU 0 (GPU-fa4e0000-0000-0000-0000-000000000000): "
                      "Xid 79, the GPU has fallen off the bus", err)
        # The round forms again with the spare; a node lost, no restart spent.
        seated = lambda: self.status()["state"] == "running" and {
            n["host"] for n in self.status()["node_list"] if n["state"] == "running"} == {
            "nodeA", "nodeC"}
        self.assertTrue(wait_for(seated, 30), self.logs())
        job = self.status()
        self.assertEqual((job["round"], job["restarts"]), (1, 0), job)
        self.assertEqual([e["host"] for e in job["excluded"]], ["nodeB"], job)
        self.assertIn("Xid 79", job["excluded"][0]["cause"])
        open(os.path.join(self.work, "finish"), "w").close()
        for proc, name in ((a, "nodeA"), (c, "nodeC")):
            code, _ = self.finish(proc, name)
            self.assertEqual(code, 0, self.logs())
        self.assertEqual({h for h, _, _ in marks(self.work, "done")}, {"nodeA", "nodeC"})

    def test_a_spare_whose_preflight_fails_is_never_seated_and_the_job_goes_on(self):
        """Issue 32, "Must work" 3: --preflight allreduce in the round that seats a
        spare; the spare's rank sums wrong (the all-reduce's test hook)."""
        conf = ("--preflight", "allreduce", "--rdzv-conf", "last_call_timeout=1")
        a = self.start_on("nodeA", None, *conf, bad="none", nnodes="1:2")
        b = self.start_on("nodeB", None, *conf, bad="none", nnodes="1:2")
        started = lambda: {h for h, r, _ in marks(self.work, "start")} == {"nodeA", "nodeB"}
        self.assertTrue(wait_for(started, 60), self.logs())
        # nodeC sorts after nodeA: rank 1 of the round that seats it, whose sum it spoils.
        c = self.start_on("nodeC", None, *conf, bad="none", nnodes="1:2",
                          MUSTER_ALLREDUCE_TEST_CORRUPT_RANK="1")
        self.assertTrue(wait_for(lambda: self.status()["waiting"] == 1, 30), self.logs())
        b.send_signal(signal.SIGTERM)  # nodeB leaves: the spare is seated, and checked
        code, err = self.finish(c, "nodeC")
        self.assertEqual(code, EXIT_NODE_EXCLUDED, self.logs())
        self.assertIn("pre-flight all-reduce failed in the round that seated it", err)
        self.assertNotIn("nodeC", {h for h, _, _ in marks(self.work, "start")},
                         "the spare's script never started")
        # nodeA goes on alone (min 1), the script started again without a restart.
        again = lambda: len([1 for h, _, _ in marks(self.work, "start") if h == "nodeA"]) >= 1 \
            and self.status()["state"] == "running" and self.status()["nodes"] == 1
        self.assertTrue(wait_for(again, 60), self.logs())
        job = self.status()
        self.assertEqual(job["restarts"], 0, job)
        self.assertEqual([e["host"] for e in job["excluded"]], ["nodeC"], job)
        open(os.path.join(self.work, "finish"), "w").close()
        code, _ = self.finish(a, "nodeA")
        self.assertEqual(code, 0, self.logs())

    def test_a_spare_whose_gpu_is_faulty_is_never_seated(self):
        """Issue 32, "Must work" 3, the other way: the spare's GPU has retired
        pages pending, as the fake NVML shows it; its health check, before it
        joins, keeps it out."""
        gpus = {host: self.fake_gpu(host) for host in ("nodeA", "nodeB", "nodeC")}
        open(os.path.join(gpus["nodeC"]["FAKE_NVML_DIR"], "pending.0"), "w").close()
        a = self.start_on("nodeA", None, bad="none", **gpus["nodeA"])
        b = self.start_on("nodeB", None, bad="none", **gpus["nodeB"])
        started = lambda: {h for h, r, _ in marks(self.work, "start")} == {"nodeA", "nodeB"}
        self.assertTrue(wait_for(started, 60), self.logs())
        c = self.start_on("nodeC", None, bad="none", **gpus["nodeC"])
        code, err = self.finish(c, "nodeC")
        self.assertEqual(code, EXIT_NODE_EXCLUDED, self.logs())
        self.assertIn("this node's GPUs failed their health check: GPU 0 "
                      "(GPU-fa4e0000-0000-0000-0000-000000000000): retired pages are pending", err)
        job = self.status()
        self.assertEqual([e["host"] for e in job["excluded"]], ["nodeC"], job)
        self.assertEqual((job["state"], job["round"], job["waiting"]), ("running", 0, 0), job)
        open(os.path.join(self.work, "finish"), "w").close()
        for proc, name in ((a, "nodeA"), (b, "nodeB")):
            code, _ = self.finish(proc, name)
            self.assertEqual(code, 0, self.logs())


if __name__ == "__main__":
    import unittest
    unittest.main()
