"""The sbatch examples in scripts/sbatch/, submitted unchanged with
`sbatch --wait` to a real Slurm on this machine (tests/slurm/cluster.sh:
slurmctld and two slurmd, node1 and node2)."""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

from harness import (PYTHON, RDZV_CALL, ROOT, TempDirTest, env, pid_alive, run, wait_for,
                     worker_records, WORKERS)
from test_musterd import MUSTERD

CLUSTER = os.path.join(ROOT, "tests", "slurm", "cluster.sh")
SBATCH = os.path.join(ROOT, "scripts", "sbatch")
RECORD = os.path.join(WORKERS, "record.py")
LAUNCHER_DIR = os.path.dirname(os.environ.get("MUSTER", os.path.join(ROOT, "build", "launcher", "muster")))


def why_no_cluster():
    if os.geteuid() != 0:
        return "needs root to start slurmd and munged"
    for tool in ("slurmctld", "slurmd", "sbatch", "munged"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/setup installs slurm-wlm and munge)"
    return None


@unittest.skipIf(why_no_cluster(), why_no_cluster())
class SlurmCluster(TempDirTest):
    """Starts the test cluster for its class, and stops it after."""

    @classmethod
    def setUpClass(cls):
        cls.state = tempfile.mkdtemp(prefix="muster-slurm-")
        e = dict(os.environ, MUSTER_SLURM_DIR=cls.state)
        started = subprocess.run([CLUSTER, "start"], env=e, capture_output=True, text=True, timeout=60)
        if started.returncode != 0:
            subprocess.run([CLUSTER, "stop"], env=e, timeout=60)
            raise RuntimeError(f"the test cluster did not start: {started.stderr}")
        cls.conf = os.path.join(cls.state, "slurm.conf")

    @classmethod
    def tearDownClass(cls):
        subprocess.run([CLUSTER, "stop"], env=dict(os.environ, MUSTER_SLURM_DIR=cls.state), timeout=60)
        shutil.rmtree(cls.state, ignore_errors=True)

    def sbatch(self, script, *args, timeout=180, **extra):
        """Submits an example unchanged and waits for it; (exit code, its output)."""
        out = self.path("job.out")
        e = env(SLURM_CONF=self.conf, PATH=LAUNCHER_DIR + ":" + os.environ["PATH"], **extra)
        for key in [k for k in e if k.startswith("SLURM_") and k != "SLURM_CONF"]:
            del e[key]
        options = []  # sbatch options before the script, e.g. --ntasks-per-node=2
        while script.startswith("--"):
            options.append(script)
            script, *args = args
        r = subprocess.run(["sbatch", "--wait", f"--output={out}", "--chdir", ROOT, *options,
                            os.path.join(SBATCH, script), *args],
                           env=e, capture_output=True, text=True, timeout=timeout)
        output = open(out).read() if os.path.exists(out) else ""
        return r.returncode, output + r.stderr

    def submit(self, *args, **extra):
        """sbatch --wait in the background: (process, job id)."""
        out = self.path("job.out")
        e = env(SLURM_CONF=self.conf, PATH=LAUNCHER_DIR + ":" + os.environ["PATH"],
                TRAIN=os.path.join(WORKERS, "signals.py"), **extra)
        for key in [k for k in e if k.startswith("SLURM_") and k != "SLURM_CONF"]:
            del e[key]
        proc = subprocess.Popen(["sbatch", "--wait", "--parsable", f"--output={out}", "--chdir",
                                 ROOT, os.path.join(SBATCH, "multi-node.sbatch"), self.tmp, *args],
                                env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        job_id = proc.stdout.readline().strip().split(";")[0]
        self.assertTrue(job_id.isdigit(), f"sbatch said {job_id!r}")
        self.e = e
        return proc, job_id

    def both_started(self):
        return wait_for(lambda: all(os.path.exists(self.path(f"pid.{r}")) for r in (0, 1)), 60)


class RealSlurm(SlurmCluster):
    def test_multi_node_ranks_are_unique_across_both_nodes(self):
        code, output = self.sbatch("multi-node.sbatch", self.tmp, TRAIN=RECORD)
        self.assertEqual(code, 0, output)
        records = worker_records(self.tmp)
        # No GPUs here: one worker per node.
        self.assertEqual(sorted(r[2] for r in records), [0, 1], output)
        self.assertEqual({r[1] for r in records}, {2})
        self.assertEqual(len({r[3]["MASTER_ADDR"] + ":" + r[3]["MASTER_PORT"] for r in records}), 1)
        self.assertIn("(SLURM_JOB_ID)", output)

    def test_allreduce_across_the_allocation_is_correct(self):
        code, output = self.sbatch("allreduce.sbatch", "-e", "1M")
        self.assertEqual(code, 0, output)
        self.assertIn("2 ranks", output)
        self.assertIn("# Wrong values         : 0 OK", output)

    def test_allreduce_with_a_task_per_rank_reads_slurms_variables(self):
        code, output = self.sbatch("allreduce-tasks.sbatch", "-e", "1M", "--backend", "tcp")
        self.assertEqual(code, 0, output)
        self.assertIn("4 ranks, backend tcp", output)
        self.assertIn("# Wrong values         : 0 OK", output)
        self.assertIn("RANK 0 (SLURM_PROCID)", output)
        self.assertIn("MASTER_ADDR node1 (the first host of SLURM_STEP_NODELIST)", output)

    def test_single_node_runs_the_real_pytorch_ddp_script(self):
        code, output = self.sbatch("single-node.sbatch", "--epochs", "1", timeout=300,
                                   TRAIN=os.path.join(ROOT, "examples", "ddp_train.py"),
                                   PYTHON_EXEC=PYTHON)
        self.assertEqual(code, 0, output)

    def test_two_tasks_per_node_by_mistake_is_a_clear_error(self):
        code, output = self.sbatch("--ntasks-per-node=2", "multi-node.sbatch", self.tmp, TRAIN=RECORD)
        self.assertNotEqual(code, 0, output)
        self.assertIn("--ntasks-per-node=1", output)
        self.assertEqual(worker_records(self.tmp), [], "no worker may start")

    def test_elastic_job_restarts_inside_the_allocation_and_completes(self):
        code, output = self.sbatch("elastic.sbatch", self.tmp, "--fail-rank", "1", TRAIN=RECORD)
        self.assertEqual(code, 0, output)
        restarts = {r[0] for r in worker_records(self.tmp)}
        self.assertEqual(restarts, {0, 1}, output)


class RealSlurmSignals(SlurmCluster):
    """scancel and --signal as Slurm sends them, reaching every worker."""

    def test_scancel_reaches_every_worker_and_leaves_no_process(self):
        proc, job_id = self.submit("--seconds", "60")
        self.assertTrue(self.both_started(), open(self.path("job.out")).read())
        pids = [int(open(self.path(f"pid.{r}")).read()) for r in (0, 1)]
        subprocess.run(["scancel", job_id], env=self.e, check=True, timeout=30)
        proc.wait(timeout=60)
        self.assertNotEqual(proc.returncode, 0)
        for r in (0, 1):
            self.assertTrue(os.path.exists(self.path(f"SIGTERM.{r}")), f"rank {r} got no SIGTERM")
        self.assertTrue(wait_for(lambda: not any(pid_alive(p) for p in pids), 15), "a worker lives on")
        left = subprocess.run(["pgrep", "-f", self.tmp], capture_output=True, text=True)
        self.assertEqual(left.stdout.strip(), "", "processes of the job are left")

    def test_usr1_reaches_every_worker_and_the_job_goes_on(self):
        proc, job_id = self.submit("--seconds", "4")
        self.assertTrue(self.both_started(), open(self.path("job.out")).read())
        subprocess.run(["scancel", "--signal=USR1", job_id], env=self.e, check=True, timeout=30)
        self.assertTrue(wait_for(lambda: all(os.path.exists(self.path(f"SIGUSR1.{r}"))
                                             for r in (0, 1)), 20), "SIGUSR1 did not reach every worker")
        proc.wait(timeout=60)
        self.assertEqual(proc.returncode, 0, open(self.path("job.out")).read())
        self.assertFalse(any(os.path.exists(self.path(f"SIGTERM.{r}")) for r in (0, 1)))


class RealSlurmMunge(SlurmCluster):
    """Issue 11, must work 3: inside the allocation the agents use munge with no flag
    (munged runs on its default socket, as on a cluster); another uid on the same
    host, who knows the job's id and port, is refused, and the job goes on."""

    def call(self, port, method, request, *args, user=None):
        """rdzv-call's (status name, message), run as `user` (runuser) or as root."""
        command = [RDZV_CALL, "--target", f"127.0.0.1:{port}", "--timeout", "5", *args, method,
                   json.dumps(request)]
        if user is not None:
            command = ["runuser", "-u", user, "--", *command]
        result = run(command, timeout=30)
        lines = result.stdout.splitlines()
        self.assertTrue(lines, f"rdzv-call printed nothing: {result.stderr}")
        code, _, message = lines[-1].partition("\t")
        return code, message

    def test_a_job_uses_munge_with_no_flag_and_refuses_another_uid(self):
        proc, job_id = self.submit("--seconds", "15")
        self.assertTrue(self.both_started(), open(self.path("job.out")).read())
        port = 20000 + int(job_id) % 10000  # SlurmRendezvousPort
        join = {"jobId": job_id, "config": {"minNodes": 2, "maxNodes": 2},
                "node": {"nodeId": "intruder", "host": "node1", "localWorldSize": 1}}

        # The job's own uid, with a credential, is answered: the refusals below can fail.
        code, message = self.call(port, "Status", {"jobId": job_id}, "--munge")
        self.assertEqual(code, "OK", message)
        code, message = self.call(port, "Status", {"jobId": job_id})
        self.assertEqual(code, "UNAUTHENTICATED", message)
        code, message = self.call(port, "Join", join, "--munge", user="nobody")
        self.assertEqual(code, "PERMISSION_DENIED", message)
        self.assertIn("uid 65534 may not use this rendezvous: it serves uid 0's job", message)
        code, message = self.call(port, "ReportFailure",
                                  {"jobId": job_id, "nodeId": "intruder", "failure": {"exitCode": 1}},
                                  "--munge", user="nobody")
        self.assertEqual(code, "PERMISSION_DENIED", message)
        for method, request in (("Stop", {"jobId": job_id}), ("ListJobs", {}),
                                ("WatchJob", {"jobId": job_id})):
            code, message = self.call(port, method, request, "--munge", user="nobody")
            self.assertEqual(code, "PERMISSION_DENIED", f"{method}: {message}")

        # musterd --munge keeps uids apart; metrics with no password of their
        # own would show every uid's jobs, so they are refused.
        refused = run([MUSTERD, "--port", "0", "--munge", "--metrics-port", "0"], timeout=30)
        self.assertEqual(refused.returncode, 2, refused.stderr)
        self.assertIn("--metrics-port with --munge: the metrics would show every uid's jobs",
                      refused.stderr)

        proc.wait(timeout=90)
        output = open(self.path("job.out")).read()
        self.assertEqual(proc.returncode, 0, output)
        self.assertEqual(output.count("(auth: munge, uid 0)"), 2, output)  # host and client
        self.assertNotIn("no rendezvous token", output)
        self.assertIn("uid 65534 is not uid 0", output)  # the hosting agent decoded it
        self.assertFalse(any(os.path.exists(self.path(f"SIGTERM.{r}")) for r in (0, 1)), output)


if __name__ == "__main__":
    unittest.main()
