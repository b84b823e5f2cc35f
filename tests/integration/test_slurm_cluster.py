"""The sbatch examples in scripts/sbatch/, submitted unchanged with
`sbatch --wait` to a real Slurm on this machine (tests/slurm/cluster.sh:
slurmctld and two slurmd, node1 and node2)."""
import os
import shutil
import subprocess
import tempfile
import unittest

from harness import PYTHON, ROOT, TempDirTest, env, worker_records, WORKERS

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
class RealSlurm(TempDirTest):
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
        r = subprocess.run(["sbatch", "--wait", f"--output={out}", "--chdir", ROOT,
                            os.path.join(SBATCH, script), *args],
                           env=e, capture_output=True, text=True, timeout=timeout)
        output = open(out).read() if os.path.exists(out) else ""
        return r.returncode, output + r.stderr

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

    def test_single_node_runs_the_real_pytorch_ddp_script(self):
        code, output = self.sbatch("single-node.sbatch", "--epochs", "1", timeout=300,
                                   TRAIN=os.path.join(ROOT, "examples", "ddp_train.py"),
                                   PYTHON_EXEC=PYTHON)
        self.assertEqual(code, 0, output)

    def test_elastic_job_restarts_inside_the_allocation_and_completes(self):
        code, output = self.sbatch("elastic.sbatch", self.tmp, "--fail-rank", "1", TRAIN=RECORD)
        self.assertEqual(code, 0, output)
        restarts = {r[0] for r in worker_records(self.tmp)}
        self.assertEqual(restarts, {0, 1}, output)


if __name__ == "__main__":
    unittest.main()
