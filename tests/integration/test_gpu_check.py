"""The GPU check and the pre-flight, with real agents and workers: NVML is
the fake library tests/tools/fake_nvml.cc builds (GPUs described by files
the test and its workers write), loaded through MUSTER_NVML_LIBRARY; the
pre-flight is the real muster-allreduce on the CPU backends."""
import json
import os
import subprocess
import unittest

from harness import MUSTER, ROOT, TempDirTest, env, muster, reserve_port

FAKE_NVML = os.environ.get("FAKE_NVML",
                           os.path.join(ROOT, "build", "tests", "tools", "libnvidia-ml.so.1"))

# A worker that "uses" GPU LOCAL_RANK (SET_DEVICE=1) or GPU 0, as NVML
# would show it, then works for RUN_FOR seconds. Local rank BUSY_AFTER_RANK
# makes its GPU busy BUSY_AFTER seconds in, with one atomic write: a file
# rewritten in place could be read empty, which the fake takes for 0%.
WORKER = """
import os, time
d = os.environ["FAKE_NVML_DIR"]
local = os.environ["LOCAL_RANK"]
gpu = local if os.environ.get("SET_DEVICE") == "1" else "0"
with open(os.path.join(d, "pids", str(os.getpid())), "w") as f:
    f.write(gpu)
start = time.monotonic()
busy = False
while time.monotonic() - start < float(os.environ["RUN_FOR"]):
    if not busy and local == os.environ.get("BUSY_AFTER_RANK") and \\
            time.monotonic() - start > float(os.environ["BUSY_AFTER"]):
        # Once, and whole: the check must never read a half-written file.
        with open(os.path.join(d, "util.tmp"), "w") as f:
            f.write("50")
        os.replace(os.path.join(d, "util.tmp"), os.path.join(d, "util." + gpu))
        busy = True
    time.sleep(0.1)
"""


class GpuCheckTest(TempDirTest):
    def setUp(self):
        super().setUp()
        self.nvml = self.path("nvml")
        os.makedirs(os.path.join(self.nvml, "pids"))
        self.gpus(4, busy=[])
        self.worker = self.path("worker.py")
        with open(self.worker, "w") as f:
            f.write(WORKER)

    def gpus(self, count, busy):
        with open(os.path.join(self.nvml, "count"), "w") as f:
            f.write(str(count))
        for gpu in range(count):
            with open(os.path.join(self.nvml, f"util.{gpu}"), "w") as f:
                f.write("97" if gpu in busy else "0")

    def launch(self, *args, run_for=6, **extra):
        log = self.path("events.jsonl")
        r = muster("--standalone", "--nproc-per-node", "4", "--gpu-check-interval", "1",
                   "--rdzv-conf", f"event_log={log}", *args, self.worker, timeout=120,
                   MUSTER_NVML_LIBRARY=FAKE_NVML, FAKE_NVML_DIR=self.nvml, RUN_FOR=run_for,
                   **extra)
        events = []
        if os.path.exists(log):
            with open(log) as f:
                events = [json.loads(line) for line in f]
        return r, events

    @staticmethod
    def gpu_lines(r):
        return [line for line in r.stderr.splitlines() if "GPU check:" in line]


class SharedGpus(GpuCheckTest):
    """1: four workers on GPU 0 of 4 warn once; one each warns not."""

    def test_every_rank_on_gpu_0_warns_once_naming_ranks_and_idle_gpus(self):
        self.gpus(4, busy=[0])
        r, events = self.launch()
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = self.gpu_lines(r)
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn("warning: GPU check: local ranks 0-3 (ranks 0-3) share GPU 0 (97% busy",
                      lines[0])
        self.assertIn("while GPUs 1-3 of this node run none of them (0%, 0%, 0% busy)", lines[0])
        self.assertIn('torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))', lines[0])
        kinds = [e["kind"] for e in events]
        self.assertEqual(kinds.count("gpu_warning"), 1, kinds)
        samples = [e for e in events if e["kind"] == "gpu_sample"]
        self.assertGreaterEqual(len(samples), 2, kinds)
        self.assertIn("GPU 0 97% busy, 1.0 GiB of 80.0 GiB, local ranks 0-3", samples[-1]["detail"])

    def test_one_rank_per_gpu_says_nothing(self):
        self.gpus(4, busy=[0, 1, 2, 3])
        r, events = self.launch("--gpu-report", SET_DEVICE=1)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.gpu_lines(r), [], r.stderr)
        self.assertNotIn("gpu_warning", [e["kind"] for e in events])
        reports = [line for line in r.stderr.splitlines() if "GPU report" in line]
        self.assertEqual(len(reports), 1, r.stderr)  # the first full check, then every 5 minutes
        for gpu in range(4):
            self.assertIn(f"GPU {gpu} 97% busy, 1.0 GiB of 80.0 GiB, local rank {gpu}", reports[0])


class IdleGpu(GpuCheckTest):
    """2: a GPU idle while the others work warns once, and clears when it works."""

    def test_idle_gpu_warns_once_then_clears(self):
        self.gpus(4, busy=[0, 1, 2])
        r, events = self.launch(run_for=8, SET_DEVICE=1, BUSY_AFTER_RANK=3, BUSY_AFTER=4)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = self.gpu_lines(r)
        self.assertEqual(len(lines), 2, r.stderr)
        self.assertIn("warning: GPU check: GPU 3 of this node was idle (0% busy) for the last 1 s "
                      "while GPUs 0-2 worked (97%, 97%, 97% busy); it is the GPU of local rank 3 "
                      "(rank 3), which uses GPU 3", lines[0])
        self.assertIn("info: GPU check: GPU 3 works now (50% busy)", lines[1])
        kinds = [e["kind"] for e in events]
        self.assertEqual((kinds.count("gpu_warning"), kinds.count("gpu_cleared")), (1, 1), kinds)


class NoNvml(GpuCheckTest):
    """3: without NVML, not a word; the check off, the job as ever."""

    def test_no_library_no_warning_no_error(self):
        for library in ("/nonexistent/libnvidia-ml.so.1", None):
            extra = {"MUSTER_NVML_LIBRARY": library} if library else {}
            r = muster("--standalone", "--nproc-per-node", "2", "--no-python", "/bin/true",
                       timeout=60, **extra)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertNotIn("GPU", r.stderr)
            self.assertNotIn("NVML", r.stderr)

    def test_check_off_or_bad_options(self):
        self.gpus(4, busy=[0])
        r, events = self.launch("--gpu-check-interval", "0", run_for=3)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.gpu_lines(r), [], r.stderr)
        self.assertNotIn("gpu_sample", [e["kind"] for e in events])
        for args, says in ((["--gpu-check-interval", "0.5"], "below a second"),
                           (["--gpu-check-interval", "x"], "not a number of seconds"),
                           (["--gpu-check-interval", "0", "--gpu-report"], "drop one of them"),
                           (["--preflight", "nccl"], "give --preflight allreduce, or none")):
            r = muster("--standalone", *args, "--no-python", "/bin/true", timeout=60)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(says, r.stderr)

    def test_visible_devices_beyond_nvml_turn_the_check_off_with_the_reason(self):
        self.gpus(2, busy=[0])
        r, _ = self.launch(run_for=1, CUDA_VISIBLE_DEVICES="0,5")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("GPU check off: CUDA_VISIBLE_DEVICES entry '5' names none of the 2 GPUs",
                      r.stderr)


class Preflight(TempDirTest):
    """4: the pre-flight passes and the script starts; a wrong sum stops the job first."""

    SCRIPT = "import os\nopen(os.path.join({!r}, 'ran.' + os.environ['RANK']), 'w').close()\n"

    def script(self):
        path = self.path("train.py")
        with open(path, "w") as f:
            f.write(self.SCRIPT.format(self.tmp))
        return path

    def ran(self):
        return sorted(n for n in os.listdir(self.tmp) if n.startswith("ran."))

    def test_a_passing_preflight_starts_the_script(self):
        r = muster("--standalone", "--nproc-per-node", "2", "--preflight", "allreduce",
                   self.script(), timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("# Wrong values         : 0 OK", r.stdout)
        self.assertIn("the pre-flight all-reduce passed on this node; starting the script",
                      r.stderr)
        self.assertEqual(self.ran(), ["ran.0", "ran.1"])

    def test_a_wrong_sum_stops_the_job_before_the_script_without_a_restart(self):
        r = muster("--standalone", "--nproc-per-node", "2", "--preflight", "allreduce",
                   "--max-restarts", "3", self.script(), timeout=120,
                   MUSTER_ALLREDUCE_TEST_CORRUPT_RANK=1)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("FAILED", r.stdout)  # the all-reduce's own report
        self.assertIn("the script is not started", r.stderr)
        self.assertIn("muster-allreduce (the pre-flight, --preflight) FAILED", r.stderr)
        self.assertIn("no restart mends", r.stderr)
        self.assertNotIn("restart 1 of 3", r.stderr)
        self.assertEqual(self.ran(), [])

    def test_two_nodes_both_stop_when_one_rank_is_wrong(self):
        port = reserve_port()
        procs = []
        for name in ("a", "b"):
            out = open(self.path(f"{name}.out"), "w")
            err = open(self.path(f"{name}.err"), "w")
            procs.append(subprocess.Popen(
                [MUSTER, "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "job", "--max-restarts",
                 "3", "--rdzv-conf", "last_call_timeout=1", "--preflight", "allreduce",
                 self.script()],
                env=env(MUSTER_ALLREDUCE_TEST_CORRUPT_RANK=3), stdout=out, stderr=err,
                stdin=subprocess.DEVNULL, start_new_session=True))
            self.addCleanup(self._reap, procs[-1], out, err)
        codes = [p.wait(timeout=120) for p in procs]
        errors = self.read("a.err") + self.read("b.err")
        self.assertEqual(codes, [1, 1], errors)
        self.assertEqual(self.ran(), [], errors)
        for name in ("a", "b"):  # each names the reason, whichever saw it first
            self.assertIn("in the pre-flight all-reduce (--preflight): the job's communication is "
                          "broken, which no restart mends", self.read(f"{name}.err"))

# Attempt 0 starts a process of its own session (the agent's group kill does
# not reach it, as a CUDA context being torn down lingers) that "holds" GPU 0
# for HOLD seconds, then fails; attempt 1 records when it started.
RELEASE_WORKER = """
import os, subprocess, sys, time
d, work = os.environ["FAKE_NVML_DIR"], os.environ["WORK"]
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
if attempt == "0":
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; time.sleep(float(sys.argv[1])); "
         "open(sys.argv[2], 'w').write(repr(time.time()))", os.environ["HOLD"],
         os.path.join(work, "released")], start_new_session=True)
    open(os.path.join(work, "holder"), "w").write(str(holder.pid))
    open(os.path.join(d, "pids", str(holder.pid)), "w").write("0")
    time.sleep(0.2)
    sys.exit(1)
open(os.path.join(work, "started.1"), "w").write(repr(time.time()))
"""


class GpuRelease(GpuCheckTest):
    """4: a restarted round waits for the last round's GPU memory, bounded."""

    def setUp(self):
        super().setUp()
        self.gpus(1, busy=[])
        self.work = self.path("work")
        os.makedirs(self.work)
        self.worker = self.path("release_worker.py")
        with open(self.worker, "w") as f:
            f.write(RELEASE_WORKER)
        self.addCleanup(self.kill_holder)

    def kill_holder(self):
        path = os.path.join(self.work, "holder")
        if os.path.exists(path):
            try:
                os.kill(int(open(path).read()), 9)
            except ProcessLookupError:
                pass

    def run_job(self, hold, *args):
        return muster("--standalone", "--nproc-per-node", "1", "--max-restarts", "1", *args,
                      self.worker, timeout=120, MUSTER_NVML_LIBRARY=FAKE_NVML,
                      FAKE_NVML_DIR=self.nvml, WORK=self.work, HOLD=hold)

    def test_the_next_round_starts_once_the_old_holder_is_gone(self):
        r = self.run_job("3")
        self.assertEqual(r.returncode, 0, r.stderr)
        released = float(open(os.path.join(self.work, "released")).read())
        started = float(open(os.path.join(self.work, "started.1")).read())
        self.assertGreaterEqual(started, released, r.stderr)
        self.assertRegex(r.stderr, r"waited [0-9.]+ s for the last round's processes to free "
                                   r"this node's GPUs")

    def test_a_holder_that_never_goes_is_named_and_the_round_starts_after_the_bound(self):
        r = self.run_job("60", "--gpu-release-wait", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        holder = int(open(os.path.join(self.work, "holder")).read())
        self.assertFalse(os.path.exists(os.path.join(self.work, "released")))
        self.assertIn(f"still hold memory on this node's GPUs (pid {holder} on GPU 0); starting "
                      "the round anyway", r.stderr)

    def test_no_wait_when_asked_for_none(self):
        r = self.run_job("60", "--gpu-release-wait", "0")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("GPUs", r.stderr.split("restart 1 of 1")[-1])


if __name__ == "__main__":
    unittest.main()
