"""muster --standalone against real processes and real PyTorch: the
"Must work" list of the foundation issue, each as a user would notice it."""
import glob
import json
import os
import shutil
import signal
import time
import unittest

from harness import (DDP_TRAIN, WORKERS, TempDirTest, muster, pid_alive, read_env, read_file,
                     torchrun, wait_for)

TORCHRUN_VARS = [
    "LOCAL_RANK", "RANK", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE",
    "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
]


class DdpTraining(TempDirTest):
    """1 and 2: a real DDP script, unchanged, and elastic restarts."""

    def test_same_parameters_as_torchrun(self):
        ours = muster("--standalone", "--nproc-per-node", "2", DDP_TRAIN, "--epochs", "2",
                      "--out", self.path("muster.json"))
        self.assertEqual(ours.returncode, 0, ours.stderr)
        theirs = torchrun("--standalone", "--nproc_per_node", "2", DDP_TRAIN, "--epochs", "2",
                          "--out", self.path("torchrun.json"))
        self.assertEqual(theirs.returncode, 0, theirs.stderr)
        a = json.loads(self.read("muster.json"))
        b = json.loads(self.read("torchrun.json"))
        self.assertEqual(a["world_size"], 2)
        self.assertEqual(a["params"], b["params"])
        # Every line of rank 0 reaches the console, prefixed.
        self.assertIn("[rank 0]: epoch 1: mean loss", ours.stdout)

    def test_crash_once_restarts_and_finishes(self):
        result = muster("--standalone", "--nproc-per-node", "2", "--max-restarts", "1", DDP_TRAIN,
                        "--epochs", "1", "--out", self.path("out.json"), "--crash-rank", "1",
                        "--crash-marker", self.path("crashed"))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertTrue(os.path.exists(self.path("crashed")))
        self.assertEqual(json.loads(self.read("out.json"))["restart_count"], 1)
        self.assertIn("restart 1 of 1", result.stderr)

    def test_crash_without_restarts_fails_with_table(self):
        result = muster("--standalone", "--nproc-per-node", "2", "--max-restarts", "0", DDP_TRAIN,
                        "--epochs", "1", "--crash-rank", "1", "--crash-marker",
                        self.path("crashed"))
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("FAILED", result.stderr)
        self.assertIn("Root Cause", result.stderr)
        row = [line for line in result.stderr.splitlines() if line.lstrip().startswith("* ")]
        self.assertEqual(len(row), 1, result.stderr)
        self.assertRegex(row[0], r"\* 1 \(1\)\s.*exit code 1")


class Environment(TempDirTest):
    """3: every variable of torchrun's table, with torchrun's values."""

    def dump(self, launcher, directory):
        os.mkdir(directory)
        command = f'env > {directory}/env.$LOCAL_RANK'
        if launcher == "muster":
            result = muster("--standalone", "--nproc-per-node", "2", "--max-restarts", "2",
                            "--no-python", "sh", "-c", command)
        else:
            result = torchrun("--standalone", "--nproc_per_node", "2", "--max_restarts", "2",
                              "--no_python", "sh", "-c", command)
        self.assertEqual(result.returncode, 0, result.stderr)
        return [read_env(f"{directory}/env.{local_rank}") for local_rank in range(2)]

    def test_matches_torchrun(self):
        ours = self.dump("muster", self.path("muster"))
        if shutil.which("torchrun") is None:
            self.skipTest("torchrun is not installed (python3-torch)")
        theirs = self.dump("torchrun", self.path("torchrun"))
        for local_rank in range(2):
            a, b = ours[local_rank], theirs[local_rank]
            for var in TORCHRUN_VARS:
                self.assertIn(var, a, f"muster does not set {var}")
                self.assertIn(var, b, f"torchrun does not set {var}")
                if var in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                           "TORCHELASTIC_ERROR_FILE"):
                    continue  # per-run values, checked below
                self.assertEqual(a[var], b[var], f"{var} for local rank {local_rank}")
            self.assertTrue(a["TORCHELASTIC_ERROR_FILE"].endswith(
                f"/attempt_0/{local_rank}/error.json"), a["TORCHELASTIC_ERROR_FILE"])
            self.assertTrue(b["TORCHELASTIC_ERROR_FILE"].endswith(
                f"/attempt_0/{local_rank}/error.json"), b["TORCHELASTIC_ERROR_FILE"])
            self.assertTrue(1 <= int(a["MASTER_PORT"]) <= 65535)
            # muster gives an address, torchrun a host name: both reach this host.
            self.assertEqual(a["MASTER_ADDR"], "127.0.0.1")
            self.assertRegex(a["TORCHELASTIC_RUN_ID"], r"^[0-9a-f]{16}$")
            self.assertEqual(a["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1")
        self.assertEqual(ours[0]["MASTER_PORT"], ours[1]["MASTER_PORT"])
        self.assertEqual(ours[0]["TORCHELASTIC_RUN_ID"], ours[1]["TORCHELASTIC_RUN_ID"])

    def test_agent_environment_is_inherited_and_user_values_kept(self):
        d = self.path("env")
        os.mkdir(d)
        result = muster("--standalone", "--nproc-per-node", "2", "--no-python", "sh", "-c",
                        f"env > {d}/env.$LOCAL_RANK", MY_SETTING="kept", OMP_NUM_THREADS="3",
                        NCCL_ASYNC_ERROR_HANDLING="0")
        self.assertEqual(result.returncode, 0, result.stderr)
        e = read_env(f"{d}/env.1")
        self.assertEqual(e["MY_SETTING"], "kept")
        self.assertEqual(e["OMP_NUM_THREADS"], "3")
        self.assertEqual(e["NCCL_ASYNC_ERROR_HANDLING"], "0")
        self.assertNotIn("OMP_NUM_THREADS=1", result.stderr)


class Signals(TempDirTest):
    """4: SIGTERM reaches every worker; SIGKILL to muster leaves none behind."""

    def start_workers(self, *worker_args, grace="30", nproc=2):
        proc = self.start("--standalone", "--nproc-per-node", str(nproc), "--shutdown-timeout",
                          grace, os.path.join(WORKERS, "signals.py"), self.tmp, *worker_args)
        def pids_written():
            files = [p for p in glob.glob(self.path("pid.*")) if not p.endswith(".tmp")]
            return len(files) == nproc and [int(read_file(p)) for p in files]
        pids = wait_for(pids_written, timeout=30)
        self.assertTrue(pids, "workers did not start: " + self.read("muster.err"))
        return proc, pids

    def test_sigterm_reaches_every_worker_and_exits_143(self):
        proc, pids = self.start_workers()
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=20), 143, self.read("muster.err"))
        for rank in range(2):
            self.assertTrue(os.path.exists(self.path(f"SIGTERM.{rank}")), f"rank {rank}")
        for pid in pids:
            self.assertFalse(pid_alive(pid))

    def test_worker_ignoring_sigterm_is_killed_after_grace(self):
        proc, pids = self.start_workers("--ignore-term", grace="1")
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=20), 143, self.read("muster.err"))
        elapsed = time.monotonic() - started
        self.assertGreaterEqual(elapsed, 0.9)
        self.assertTrue(os.path.exists(self.path("SIGTERM.0")))
        for pid in pids:
            self.assertFalse(pid_alive(pid))
        self.assertIn("SIGKILL", self.read("muster.err"))

    def test_sigkill_to_muster_leaves_no_worker(self):
        proc, pids = self.start_workers(nproc=3)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        gone = wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=5)
        self.assertTrue(gone, f"workers survived: {[p for p in pids if pid_alive(p)]}")

    def test_sigusr1_is_forwarded_and_the_job_goes_on(self):
        proc, pids = self.start_workers()
        proc.send_signal(signal.SIGUSR1)
        got = wait_for(lambda: all(os.path.exists(self.path(f"SIGUSR1.{r}")) for r in range(2)),
                       timeout=10)
        self.assertTrue(got)
        self.assertIsNone(proc.poll())
        self.assertTrue(all(pid_alive(p) for p in pids))
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=20), 143)

    def test_sigint_exits_130(self):
        proc, _ = self.start_workers()
        proc.send_signal(signal.SIGINT)
        self.assertEqual(proc.wait(timeout=20), 130, self.read("muster.err"))
        self.assertTrue(os.path.exists(self.path("SIGINT.0")))


class Failures(TempDirTest):
    """5: the failure table names the rank and how it died."""

    def test_segfault_is_named(self):
        result = muster("--standalone", "--nproc-per-node", "2",
                        os.path.join(WORKERS, "fail.py"), "segv", "1", self.tmp)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("Signal 11 (SIGSEGV)", result.stderr)
        self.assertRegex(result.stderr, r"\* 1 \(1\)")
        # The other rank was stopped, not left running.
        self.assertFalse(pid_alive(int(self.read("pid.0"))))

    def test_recorded_exception_message_is_in_the_table(self):
        result = muster("--standalone", "--nproc-per-node", "2",
                        os.path.join(WORKERS, "fail.py"), "raise", "0")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("RuntimeError: rank 0 raised on purpose", result.stderr)
        self.assertIn("Traceback", result.stderr)

    def test_no_exit_barrier_after_a_crash(self):
        started = time.monotonic()
        result = muster("--standalone", "--nproc-per-node", "2",
                        os.path.join(WORKERS, "fail.py"), "exit1", "1")
        self.assertEqual(result.returncode, 1)
        # The healthy rank sleeps 30 s; muster must stop it, not wait for it.
        self.assertLess(time.monotonic() - started, 20)


class BadInput(TempDirTest):
    """6: one clear line, exit 2, nothing spawned."""

    def check(self, *args, mentions, **extra_env):
        marker = self.path("spawned")
        touch = os.path.join(WORKERS, "touch.py")
        result = muster(*args, **extra_env) if "SCRIPT" not in args else muster(
            *[touch if a == "SCRIPT" else a for a in args], marker, **extra_env)
        self.assertEqual(result.returncode, 2, f"{args}: {result.stderr}")
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        self.assertEqual(len(lines), 1, f"{args}: {result.stderr}")
        self.assertTrue(lines[0].startswith("muster: error: "), lines[0])
        self.assertIn(mentions, lines[0])
        self.assertFalse(os.path.exists(marker), f"{args} spawned a worker")
        return lines[0]

    def test_each_bad_input(self):
        self.check("--nnodes", "3:1", "SCRIPT", mentions="--nnodes")
        self.check("--nnodes", "0", "SCRIPT", mentions="--nnodes")
        self.check("--standalone", "--nproc-per-node", "0", "SCRIPT", mentions="--nproc-per-node")
        self.check("--standalone", "--nproc-per-node", "gpu", "SCRIPT", mentions="GPU",
                   CUDA_VISIBLE_DEVICES="")
        self.check("--standalone", "-m", "--no-python", "SCRIPT", mentions="-m")
        self.check("--standalone", mentions="script")
        self.check("--standalone", "/nonexistent/train.py", mentions="/nonexistent/train.py")
        self.check("--standalone", "--no-python", os.path.join(WORKERS, "touch.py"),
                   mentions="not executable")
        self.check("--standalone", "--no-python", "no-such-program-xyz",
                   mentions="no-such-program-xyz")
        self.check("--standalone", "--bogus", "SCRIPT", mentions="--bogus")
        self.check("--standalone", "--rdzv-conf", "join_timeout", "SCRIPT", mentions="--rdzv-conf")
        self.check("--standalone", "-r", "7", "SCRIPT", mentions="-r")
        self.check("--standalone", "SCRIPT", mentions="PYTHON_EXEC",
                   PYTHON_EXEC="/nonexistent/python")

    def test_help_exits_0(self):
        result = muster("--help")
        self.assertEqual(result.returncode, 0)
        self.assertIn("--nproc-per-node", result.stdout)


class Output(TempDirTest):
    """-r, -t, --log-dir, --local-ranks-filter, ${local_rank}, -m."""

    def test_console_prefix_and_local_rank_substitution(self):
        result = muster("--standalone", "--nproc-per-node", "2",
                        os.path.join(WORKERS, "echo.py"), "--shard=${local_rank}", "--x")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("[rank 0]: out from 0 args=--shard=0 --x", result.stdout)
        self.assertIn("[rank 1]: out from 1 args=--shard=1 --x", result.stdout)
        self.assertIn("[rank 1]: err from 1", result.stderr)

    def test_tee_writes_files_and_console(self):
        logs = self.path("logs")
        result = muster("--standalone", "--nproc-per-node", "2", "--log-dir", logs, "-t", "3",
                        "--rdzv-id", "ignored", os.path.join(WORKERS, "echo.py"))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("[rank 1]: out from 1", result.stdout)
        files = sorted(glob.glob(os.path.join(logs, "*", "attempt_0", "1", "stdout.log")))
        self.assertEqual(len(files), 1, os.listdir(logs))
        self.assertEqual(read_file(files[0]), "out from 1 args=\n")

    def test_redirect_keeps_output_off_the_console(self):
        logs = self.path("logs")
        result = muster("--standalone", "--nproc-per-node", "2", "--log-dir", logs, "-r", "0:1",
                        os.path.join(WORKERS, "echo.py"))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertNotIn("out from 0", result.stdout)
        self.assertIn("out from 1", result.stdout)
        [f] = glob.glob(os.path.join(logs, "*", "attempt_0", "0", "stdout.log"))
        self.assertEqual(read_file(f), "out from 0 args=\n")
        self.assertEqual(glob.glob(os.path.join(logs, "*", "attempt_0", "1", "stdout.log")), [])

    def test_local_ranks_filter(self):
        result = muster("--standalone", "--nproc-per-node", "3", "--local-ranks-filter", "0,2",
                        os.path.join(WORKERS, "echo.py"))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("[rank 0]: out from 0", result.stdout)
        self.assertIn("[rank 2]: out from 2", result.stdout)
        self.assertNotIn("out from 1", result.stdout)

    def test_module(self):
        result = muster("--standalone", "--nproc-per-node", "2", "-m", "pkg.hello",
                        PYTHONPATH=WORKERS)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("[rank 1]: module hello rank 1 argv0=hello.py", result.stdout)

    def test_pet_environment(self):
        result = muster(os.path.join(WORKERS, "echo.py"), PET_STANDALONE="1",
                        PET_NPROC_PER_NODE="3")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("[rank 2]: out from 2", result.stdout)

    def test_native_program_runs_without_no_python(self):
        result = muster("--standalone", "--nproc-per-node", "2", "/bin/echo", "native")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("[rank 1]: native", result.stdout)

    def test_static_backend_single_node(self):
        d = self.path("env")
        os.mkdir(d)
        result = muster("--nproc-per-node", "2", "--master-port", "29555", "--no-python", "sh",
                        "-c", f"env > {d}/env.$LOCAL_RANK")
        self.assertEqual(result.returncode, 0, result.stderr)
        e = read_env(f"{d}/env.1")
        self.assertEqual((e["RANK"], e["WORLD_SIZE"], e["MASTER_PORT"]), ("1", "2", "29555"))


if __name__ == "__main__":
    unittest.main()
