"""muster-allreduce, the bundled worker: under muster and torchrun, with a
bad environment, a dead rank, a missing rank, two ranks on one GPU, and a
wrong result made on purpose."""
import json
import os
import re
import signal
import socket
import subprocess
import time
import unittest

from harness import ROOT, TempDirTest, env, muster, reserve_port, reserve_port_pair, torchrun, wait_for

HAVE_GPU = os.path.exists("/dev/nvidia0")
# The GPUs the ranks see: CUDA_VISIBLE_DEVICES's entries where it is set.
GPUS = (len([d for d in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()])
        if "CUDA_VISIBLE_DEVICES" in os.environ
        else len([d for d in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", d)]))
ALLREDUCE = os.environ.get("ALLREDUCE", os.path.join(ROOT, "build", "launcher", "muster-allreduce"))
ROW = re.compile(r"^\[rank 0\]:\s+(\d+)\s+(\d+)\s+(\w+)\s+sum\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)"
                 r"\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)$", re.M)



def rows(output):
    """(bytes, count, type, wrong, inplace wrong) of each table row rank 0 printed."""
    return [(int(m[1]), int(m[2]), m[3], int(m[7]), int(m[11])) for m in ROW.finditer(output)]


def start_ranks(world, ranks, *args, rank0_out=None, args_of=None, port=None, **extra):
    """Ranks started by hand, as a launcher would, with their own pipes (rank 0's
    stdout to the file rank0_out, when given). args_of(rank) overrides args."""
    port = port or reserve_port()
    procs = {}
    for rank in ranks:
        e = env(RANK=rank, WORLD_SIZE=world, LOCAL_RANK=rank, MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port, **extra)
        stdout = open(rank0_out, "w") if rank == 0 and rank0_out else subprocess.PIPE
        procs[rank] = subprocess.Popen([ALLREDUCE, *(args_of(rank) if args_of else args)], env=e,
                                       stdout=stdout, stderr=subprocess.PIPE, text=True,
                                       stdin=subprocess.DEVNULL)
    return procs


def finish(procs, timeout):
    """Each rank's (exit code, stdout, stderr); kills what is left at the timeout."""
    out = {}
    deadline = time.monotonic() + timeout
    for rank, p in procs.items():
        try:
            stdout, stderr = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            out[rank] = (p.returncode, stdout, stderr)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
            out[rank] = (None, stdout, stderr)  # hung
    return out


class UnderMuster(TempDirTest):
    def test_four_ranks_shared_memory_every_size_correct_and_the_table_printed(self):
        self.four_ranks("shm", ["--backend", "shm"])

    def test_four_ranks_tcp_every_size_correct_and_the_table_printed(self):
        self.four_ranks("tcp", ["--backend", "tcp"])

    def four_ranks(self, backend, args):
        # 12 bytes: 3 floats over 4 ranks; 4 bytes: a count of 1; up to 1 MiB.
        json_path = self.path("result.json")
        r = muster("--standalone", "--nproc-per-node", "4", "--no-python", "muster-allreduce",
                   "-b", "4", "-e", "1M", "-f", "3", "--json", json_path, *args)
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        table = rows(r.stdout)
        sizes = [t[0] for t in table]
        self.assertEqual(sizes, [4, 12, 36, 108, 324, 972, 2916, 8748, 26244, 78732, 236196, 708588])
        self.assertEqual([t[1] for t in table], [s // 4 for s in sizes])
        self.assertEqual({t[2] for t in table}, {"float"})
        self.assertEqual([(t[3], t[4]) for t in table], [(0, 0)] * len(table))
        self.assertIn(f"backend {backend}", r.stdout)
        self.assertIn("# Wrong values         : 0 OK", r.stdout)
        self.assertRegex(r.stdout, r"# Avg bus bandwidth    : [\d.]+ GB/s")

        report = json.load(open(json_path))
        self.assertEqual(report["backend"], backend)
        self.assertEqual(report["world_size"], 4)
        self.assertEqual(len(report["hosts"]), 4)
        self.assertEqual([x["bytes"] for x in report["results"]], sizes)
        for x in report["results"]:
            self.assertEqual(x["dtype"], "float")
            self.assertEqual(x["wrong"], 0)
            self.assertGreater(x["time_us"], 0)
            # busbw = algbw * 2(n-1)/n; the file keeps 6 significant digits.
            self.assertLess(abs(x["busbw_gbps"] - x["algbw_gbps"] * 1.5), 1e-5 * x["busbw_gbps"])

    def test_every_data_type_sums_right(self):
        for dtype, backend in [(d, b) for d in ("half", "bfloat16", "double") for b in ("shm", "tcp")]:
            r = muster("--standalone", "--nproc-per-node", "3", "muster-allreduce", "--backend",
                       backend, "-b", "2", "-e", "100K", "-f", "7", "-d", dtype, "-n", "2", "-w", "1")
            self.assertEqual(r.returncode, 0, dtype + r.stderr + r.stdout)
            table = rows(r.stdout)
            self.assertTrue(table, r.stdout)
            self.assertEqual({t[2] for t in table}, {dtype})
            self.assertEqual(sum(t[3] + t[4] for t in table), 0, r.stdout)


class UnderTorchrun(TempDirTest):
    def test_unchanged_under_torchrun(self):
        r = torchrun("--standalone", "--nproc_per_node", "2", "--no_python", ALLREDUCE,
                     "-b", "8", "-e", "64K")
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        # torchrun does not prefix lines: rank 0's table is on its stdout.
        self.assertIn("# Wrong values         : 0 OK", r.stdout + r.stderr)
        self.assertIn("65536", r.stdout + r.stderr)

    def test_static_rendezvous_where_torchruns_store_holds_master_port(self):
        # Without --standalone torchrun's agent hosts its TCPStore on
        # MASTER_PORT and tells the workers so (TORCHELASTIC_USE_AGENT_STORE=True),
        # as every rendezvous does from PyTorch 2.4 on: rank 0 takes the next
        # port, so that one is held for the test too.
        port = reserve_port_pair()
        r = torchrun("--nnodes", "1", "--nproc_per_node", "2", "--master_port", str(port),
                     "--no_python", ALLREDUCE, "-b", "8", "-e", "64K", "--backend", "tcp")
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertIn("# Wrong values         : 0 OK", r.stdout + r.stderr)


class BadEnvironment(TempDirTest):
    def run_alone(self, **variables):
        e = env(**variables)
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            if key not in variables:
                e.pop(key, None)
        return subprocess.run([ALLREDUCE], env=e, capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)

    def test_each_bad_variable_is_a_clear_error_with_exit_2(self):
        good = dict(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29999")
        for change, says in [({"WORLD_SIZE": None}, "WORLD_SIZE is not set"),
                             ({"RANK": "2"}, "RANK=2 but WORLD_SIZE=2"),
                             ({"MASTER_PORT": "http"}, "MASTER_PORT='http' is not a number"),
                             ({"MASTER_ADDR": None}, "MASTER_ADDR is not set")]:
            variables = {**good, **change}
            r = self.run_alone(**{k: v for k, v in variables.items() if v is not None})
            self.assertEqual(r.returncode, 2, says + r.stderr)
            self.assertIn(says, r.stderr)

    def test_bad_options_exit_2(self):
        for args, says in [(["-d", "int8"], "unknown data type"), (["-b", "1.5M"], "not a byte count"),
                           (["-b", "64", "-e", "8"], "-b"), (["--backend", "mpi"], "backend")]:
            r = subprocess.run([ALLREDUCE, *args], env=env(RANK=0, WORLD_SIZE=1),
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 2, args)
            self.assertIn(says, r.stderr + r.stdout)

    @unittest.skipUnless(GPUS >= 2, "needs two GPUs or more: LOCAL_RANK is checked against the "
                         "visible GPUs, and one visible GPU serves any LOCAL_RANK (as srun binds it)")
    def test_local_rank_beyond_the_visible_gpus(self):
        r = self.run_alone(RANK="0", WORLD_SIZE="1", LOCAL_RANK="99")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("LOCAL_RANK=99 but only", r.stderr)


@unittest.skipUnless(HAVE_GPU, "needs a GPU (no /dev/nvidia0 here): the NCCL backend")
class OnGpus(TempDirTest):
    def test_nccl_backend_one_rank_per_gpu_every_size_correct(self):
        json_path = self.path("nccl.json")
        r = muster("--standalone", "--nproc-per-node", "gpu", "muster-allreduce",
                   "-b", "8", "-e", "64M", "--backend", "nccl", "--json", json_path)
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        with open(json_path) as f:
            report = json.load(f)
        self.assertEqual(report["backend"], "nccl")
        self.assertTrue(all(d != "cpu" for d in report["devices"]), report["devices"])
        self.assertTrue(all(x["wrong"] == 0 and x["inplace"]["wrong"] == 0
                            for x in report["results"]))


class Failures(TempDirTest):
    def test_a_rank_of_another_job_is_turned_away_and_this_job_goes_on(self):
        port = reserve_port()
        args = ("-b", "8", "-e", "1K", "-n", "2", "-w", "1", "--timeout", "20")
        job_a = start_ranks(2, [0], *args, port=port, TORCHELASTIC_RUN_ID="job-a")
        stray = finish(start_ranks(2, [1], *args, port=port, TORCHELASTIC_RUN_ID="job-b"), 20)
        code, _, stderr = stray[1]
        self.assertEqual(code, 2, stderr)
        self.assertIn("belongs to job-a, not to job-b; give each job its own MASTER_PORT", stderr)
        job_a.update(start_ranks(2, [1], *args, port=port, TORCHELASTIC_RUN_ID="job-a"))
        out = finish(job_a, timeout=30)
        self.assertEqual([out[0][0], out[1][0]], [0, 0], out)
        self.assertIn("turned away rank 1 of job-b", out[0][2])
        self.assertIn("# Wrong values         : 0 OK", out[0][1])

    def test_a_rank_killed_mid_run_fails_the_others_within_the_timeout(self):
        for backend in ("shm", "tcp"):
            with self.subTest(backend=backend):
                self.kill_one_rank(backend)

    def kill_one_rank(self, backend):
        header = self.path(f"rank0-{backend}.out")
        procs = start_ranks(3, range(3), "-b", "4M", "-e", "4M", "-n", "100000", "-w", "0",
                            "--timeout", "5", "--backend", backend, rank0_out=header)
        # Killed once every rank is in the all-reduce: rank 0 printed its table header.
        self.assertTrue(wait_for(lambda: "#wrong" in open(header).read(), timeout=20),
                        "rank 0 never printed its header")
        time.sleep(0.2)
        self.assertIsNone(procs[2].poll(), "rank 2 ended early")
        procs[2].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        out = finish({0: procs[0], 1: procs[1]}, timeout=20)
        procs[2].wait()
        for rank in (0, 1):
            code, _, stderr = out[rank]
            self.assertIsNotNone(code, f"rank {rank} hung")
            self.assertNotEqual(code, 0, stderr)
            self.assertIn("error", stderr)
        self.assertLess(time.monotonic() - killed_at, 5 + 5)
        self.assertIn("rank 2", out[0][2] + out[1][2])

    def test_a_rank_that_never_comes_is_named(self):
        procs = start_ranks(3, [0, 1], "-e", "8", "--timeout", "2")
        out = finish(procs, timeout=20)
        self.assertEqual(out[0][0], 1, out[0][2])
        self.assertIn("rank 2 never reached rank 0", out[0][2])
        self.assertNotEqual(out[1][0], 0)
        self.assertIn("rank 2 never reached", out[1][2], "rank 0 tells the others why")

    def test_ranks_with_different_options_are_refused(self):
        procs = start_ranks(2, range(2), args_of=lambda r: ["-e", "64K" if r == 0 else "1M"])
        out = finish(procs, timeout=20)
        self.assertEqual(out[0][0], 2, out[0][2])
        self.assertIn("give every rank the same options", out[0][2])
        self.assertEqual(out[1][0], 2, out[1][2])

    def test_two_ranks_on_one_gpu_name_both_ranks_the_host_and_the_bus_id(self):
        procs = start_ranks(2, range(2), "-e", "8", MUSTER_ALLREDUCE_TEST_BUS_ID="0000:3b:00.0")
        out = finish(procs, timeout=20)
        self.assertEqual(out[0][0], 2, out[0][2])
        self.assertIn("ranks 0 and 1 both use the GPU at 0000:3b:00.0 on " + socket.gethostname(),
                      out[0][2])
        self.assertEqual(out[1][0], 2, out[1][2])

    def test_a_wrong_result_is_counted_and_fails_the_run(self):
        r = muster("--standalone", "--nproc-per-node", "2", "muster-allreduce", "-b", "8", "-e", "64",
                   MUSTER_ALLREDUCE_TEST_CORRUPT_RANK=1)
        self.assertEqual(r.returncode, 1, r.stdout)
        table = rows(r.stdout)
        self.assertEqual(len(table), 4)
        self.assertTrue(all(t[3] >= 1 and t[4] >= 1 for t in table), r.stdout)
        self.assertIn("FAILED", r.stdout)
        self.assertIn("wrong values", r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main()
