"""muster inside a Slurm allocation, with the environment srun sets (no
real Slurm here: tests/scripts for that come with issue 5's local cluster).
"""
import os
import random
import socket
import subprocess

from harness import MUSTER, TempDirTest, env, muster, worker_records, WORKERS

RECORD = os.path.join(WORKERS, "record.py")


def slurm_env(job_id, node_id, nnodes=2, nodelist="localhost,localhost", **extra):
    return dict(SLURM_JOB_ID=str(job_id), SLURM_NNODES=str(nnodes), SLURM_NODEID=str(node_id),
                SLURM_JOB_NODELIST=nodelist, SLURM_GPUS_ON_NODE="2", SLURM_NTASKS_PER_NODE="1",
                **extra)


class SlurmEnvironment(TempDirTest):
    @staticmethod
    def free_job_id():
        """A job id whose rendezvous port (20000 + id % 10000) nothing holds now."""
        while True:
            job_id = random.randrange(100000, 999999)
            with socket.socket() as s:
                try:
                    s.bind(("0.0.0.0", 20000 + job_id % 10000))
                    return job_id
                except OSError:
                    continue

    def agents(self, *args, **extra):
        job_id = self.free_job_id()
        procs = []
        for node in range(2):
            procs.append(subprocess.Popen(
                [MUSTER, *args, RECORD, self.tmp, "--seconds", "0.2"],
                env=env(**slurm_env(job_id, node), **extra), stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL))
        try:
            out = [p.communicate(timeout=120) for p in procs]
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            tails = [p.communicate()[1][-3000:] for p in procs]
            self.fail(f"the agents of Slurm job {job_id} did not end in 120 s:\n"
                      + "\n---\n".join(tails))
        return [p.returncode for p in procs], out, job_id

    def test_no_flags_two_nodes_from_the_allocation(self):
        codes, out, job_id = self.agents()
        self.assertEqual(codes, [0, 0], [o[1][-2000:] for o in out])
        records = worker_records(self.tmp)
        self.assertEqual(sorted(r[2] for r in records), [0, 1, 2, 3])  # 2 nodes x SLURM_GPUS_ON_NODE
        self.assertEqual({r[1] for r in records}, {4})
        self.assertEqual({r[3]["TORCHELASTIC_RUN_ID"] for r in records}, {str(job_id)})
        for _, stderr in out:
            self.assertIn(f"in Slurm job {job_id} (SLURM_JOB_ID)", stderr)
            self.assertIn(f"localhost:{20000 + job_id % 10000}", stderr)
            self.assertIn("SLURM_GPUS_ON_NODE=2", stderr)
        self.assertIn("hosting the rendezvous", out[0][1])
        self.assertNotIn("hosting the rendezvous", out[1][1])

    def test_flags_win_over_the_allocation(self):
        codes, out, _ = self.agents("--nproc-per-node", "1")
        self.assertEqual(codes, [0, 0], [o[1][-2000:] for o in out])
        records = worker_records(self.tmp)
        self.assertEqual(sorted(r[2] for r in records), [0, 1])
        self.assertEqual({r[1] for r in records}, {2})

    def test_an_accelerate_config_needs_no_flags_either(self):
        # One file for every node (issue 34): its machine_rank and
        # main_process_ip give way to the allocation; it gives the workers
        # per node (num_processes / num_machines) and the variables.
        config = self.path("accelerate.yaml")
        with open(config, "w") as f:
            f.write("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\n"
                    "mixed_precision: bf16\nnum_machines: 2\nnum_processes: 6\n"
                    "machine_rank: 0\nmain_process_ip: 192.0.2.1\nmain_process_port: 6000\n")
        codes, out, job_id = self.agents(MUSTER_ACCELERATE_CONFIG=config)
        self.assertEqual(codes, [0, 0], [o[1][-2000:] for o in out])
        records = worker_records(self.tmp)
        self.assertEqual(sorted(r[2] for r in records), [0, 1, 2, 3, 4, 5])
        self.assertEqual({r[1] for r in records}, {6})
        self.assertEqual({r[3]["ACCELERATE_MIXED_PRECISION"] for r in records}, {"bf16"})
        self.assertEqual({r[3]["TORCHELASTIC_RUN_ID"] for r in records}, {str(job_id)})
        self.assertEqual({r[3]["GROUP_RANK"] for r in records}, {"0", "1"})

    def test_an_inconsistent_allocation_names_the_variables(self):
        for extra, says in [(dict(nnodes=2, nodelist="n[1-3]"), "SLURM_NNODES=2 but SLURM_JOB_NODELIST"),
                            (dict(nnodes=2, node_id=5), "SLURM_NODEID=5 but SLURM_NNODES=2"),
                            (dict(nodelist="gpu[1-"), "'[' with no ']'")]:
            node_id = extra.pop("node_id", 0)
            r = muster(RECORD, self.tmp, **slurm_env(1234, node_id, **extra))
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(says, r.stderr)
            self.assertIn("MUSTER_IGNORE_SLURM", r.stderr)

    def test_two_tasks_per_node_is_refused(self):
        r = muster(RECORD, self.tmp, **slurm_env(1234, 0, SLURM_STEP_TASKS_PER_NODE="2(x2)"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("srun --ntasks-per-node=1", r.stderr)

    def test_standalone_ignores_the_allocation(self):
        r = muster("--standalone", "--nproc-per-node", "1", RECORD, self.tmp,
                   **slurm_env(1234, 1, nodelist="gpu[1-"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("Slurm job", r.stderr)


if __name__ == "__main__":
    import unittest
    unittest.main()
