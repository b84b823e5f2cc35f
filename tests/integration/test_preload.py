"""--preload (issue 33): the workers are forked from one interpreter per node
that imported the modules once, and each is made what a cold start makes.
Real agents, Debian's python and PyTorch, on loopback."""
import json
import os
import re
import shutil
import signal
import subprocess
import textwrap

from harness import DDP_TRAIN, MUSTER, WORKERS, TempDirTest, env, muster, pid_alive, wait_for

PROBE = os.path.join(WORKERS, "probe.py")
# What differs between any two launches, cold or not.
PER_LAUNCH = {"TORCHELASTIC_RUN_ID", "MASTER_PORT", "TORCHELASTIC_ERROR_FILE",
              "MUSTER_PROGRESS_FILE"}
FORKED = re.compile(r"--preload: (\d+) worker\(s\) forked from the preloaded interpreter, "
                    r"(\d+) started cold")


def counts(log):
    """(forked, cold) from the agent's last line on --preload."""
    found = FORKED.findall(log)
    return tuple(int(n) for n in found[-1]) if found else None


class Preload(TempDirTest):

    def launch(self, *args, cwd=None, timeout=120, **extra_env):
        return subprocess.run([MUSTER, *args], env=env(**extra_env), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL, cwd=cwd)

    def probes(self, directory):
        out = {}
        for name in os.listdir(directory):
            if name.startswith("probe.") and name.endswith(".json"):
                _, rank, restart, _ = name.split(".")
                with open(os.path.join(directory, name)) as f:
                    out[int(rank), int(restart)] = json.load(f)
        return out

    def assert_same(self, cold, warm, where):
        # Each launch is given its own directory.
        warm = json.loads(json.dumps(warm).replace(self.path("warm"), self.path("cold")))
        for key in sorted(set(cold) | set(warm)):
            with self.subTest(where=where, key=key):
                if key == "env":
                    for var in sorted(set(cold["env"]) | set(warm["env"])):
                        if var not in PER_LAUNCH:
                            self.assertEqual(cold["env"].get(var), warm["env"].get(var), var)
                elif key not in ("random", "ppid"):
                    self.assertEqual(cold[key], warm[key])

    def probe_both(self, *launch_args, cwd=None, failing=False):
        """The probes of a cold launch and of a --preload one; each (rank, restart)."""
        runs = {}
        for mode in ("cold", "warm"):
            out = self.path(mode)
            os.makedirs(out)
            if failing:
                open(os.path.join(out, "fail-once"), "w").close()
            preload = ["--preload", "torch,json"] if mode == "warm" else []
            result = self.launch("--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                                 *preload, *launch_args, out, "an arg", cwd=cwd)
            self.assertEqual(result.returncode, 0, result.stderr)
            runs[mode] = (self.probes(out), result.stderr)
        return runs

    def test_a_forked_worker_is_what_a_cold_start_makes(self):
        # The script through a symlink, by a relative path: sys.path[0] is
        # the real directory, __file__ the path as given made absolute.
        os.makedirs(self.path("real"))
        os.makedirs(self.path("link"))
        shutil.copy(PROBE, self.path("real/probe.py"))
        os.symlink("../real/probe.py", self.path("link/probe.py"))
        runs = self.probe_both("link/probe.py", cwd=self.tmp, failing=True)
        (cold, _), (warm, log) = runs["cold"], runs["warm"]
        self.assertEqual(sorted(cold), [(0, 0), (0, 1), (1, 0), (1, 1)])
        self.assertEqual(sorted(warm), sorted(cold))
        for where in cold:
            self.assert_same(cold[where], warm[where], where)
        self.assertEqual(warm[0, 0]["path0"], self.path("real"))
        self.assertEqual(warm[0, 0]["file"], self.path("link/probe.py"))
        self.assertEqual(warm[0, 0]["argv"], ["link/probe.py", self.path("warm"), "an arg"])
        self.assertTrue(warm[0, 0]["own_group"])
        self.assertEqual(warm[0, 0]["parent"], "muster", "the agent is its parent")
        # A fresh random state each, as after exec.
        self.assertEqual(len({r["random"] for r in warm.values()}), 4)
        self.assertEqual(counts(log), (4, 0), log)
        self.assertIn("--preload: torch, json imported in", log)

    def test_a_module_run_with_m_is_what_a_cold_start_makes(self):
        runs = {}
        for mode in ("cold", "warm"):
            out = self.path(mode)
            os.makedirs(out)
            preload = ["--preload", "json"] if mode == "warm" else []
            result = self.launch("--standalone", "--nproc-per-node", "2", *preload, "-m", "probe",
                                 out, cwd=self.tmp, PYTHONPATH=WORKERS)
            self.assertEqual(result.returncode, 0, result.stderr)
            runs[mode] = self.probes(out)
        for where in runs["cold"]:
            self.assert_same(runs["cold"][where], runs["warm"][where], where)
        self.assertEqual(runs["warm"][0, 0]["argv"][0], PROBE)
        self.assertEqual(runs["warm"][0, 0]["path0"], self.tmp)

    def test_ddp_gives_the_same_parameters_clean_and_after_a_restart(self):
        params = {}
        for preload in ([], ["--preload", "torch"]):
            for crash in (False, True):
                out = self.path(f"{bool(preload)}.{crash}.json")
                extra = ["--crash-rank", "1", "--crash-marker",
                         self.path(f"{bool(preload)}.crashed")] if crash else []
                result = muster("--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                                *preload, DDP_TRAIN, "--epochs", "2", "--out", out, *extra,
                                timeout=240)
                self.assertEqual(result.returncode, 0, result.stderr)
                with open(out) as f:
                    record = json.load(f)
                self.assertEqual(record["restart_count"], 1 if crash else 0)
                params[bool(preload), crash] = record["params"]
                if preload:
                    self.assertEqual(counts(result.stderr), (4 if crash else 2, 0), result.stderr)
        self.assertEqual(params[True, False], params[False, False])
        self.assertEqual(params[True, True], params[False, True])

    def test_dataloader_workers_spawned_and_multiprocessing_work(self):
        result = muster("--standalone", "--nproc-per-node", "2", "--preload", "torch",
                        os.path.join(WORKERS, "subprocesses.py"), timeout=240)
        self.assertEqual(result.returncode, 0, result.stderr)
        for rank in range(2):
            self.assertIn(f"[rank {rank}]: dataloader spawn: [0, 1, 2, 3, 4, 5, 6, 7]",
                          result.stdout + result.stderr)
            self.assertIn(f"[rank {rank}]: pool fork: [0, 1, 4, 9]", result.stdout + result.stderr)
            self.assertIn(f"[rank {rank}]: pool spawn: [0, 1, 4, 9]", result.stdout + result.stderr)
        self.assertEqual(counts(result.stderr), (2, 0), result.stderr)

    def test_the_interpreter_killed_mid_job_the_restart_starts_cold(self):
        work = self.path("work")
        os.makedirs(work)
        proc = self.start("--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                          "--preload", "torch", "--event-log-handler", "console",
                          os.path.join(WORKERS, "on_demand.py"), work)
        ready = re.compile(r"imported in [0-9.]+ s \(pid (\d+)\)")
        self.assertTrue(wait_for(lambda: ready.search(self.read("muster.err")) and
                                 len([n for n in os.listdir(work) if n.startswith("pid.")]) == 2,
                                 60), self.read("muster.err"))
        os.kill(int(ready.search(self.read("muster.err")).group(1)), signal.SIGKILL)
        self.assertTrue(wait_for(lambda: "workers start cold" in self.read("muster.err"), 10),
                        self.read("muster.err"))
        open(os.path.join(work, "fail.1.0"), "w").close()  # rank 1 of attempt 0 exits 1
        self.assertTrue(wait_for(lambda: os.path.exists(os.path.join(work, "pid.1.0")), 60),
                        self.read("muster.err"))
        open(os.path.join(work, "finish"), "w").close()
        self.assertEqual(proc.wait(timeout=60), 0, self.read("muster.err"))
        log = self.read("muster.err")
        self.assertIn("the preloaded interpreter ended (killed by signal 9); workers start cold",
                      log)
        self.assertEqual(counts(log), (2, 2), log)
        events = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
        told = [(e["kind"], e["detail"]) for e in events if e["kind"].startswith("preload")]
        self.assertEqual(len(told), 2, told)
        self.assertEqual(told[0][0], "preload_ready")
        self.assertRegex(told[0][1], r"^torch imported in [0-9.]+ s \(pid \d+\)$")
        self.assertEqual(told[1], ("preload_broken", "ended (killed by signal 9)"))

    def test_a_stop_signal_to_every_process_leaves_the_interpreter_serving(self):
        # As Slurm signals every process of a step: the interpreter ignores
        # it (it ends with the agent); the workers it forks do not.
        work = self.path("work")
        os.makedirs(work)
        proc = self.start("--standalone", "--nproc-per-node", "1", "--max-restarts", "1",
                          "--preload", "json", os.path.join(WORKERS, "on_demand.py"), work)
        ready = re.compile(r"imported in [0-9.]+ s \(pid (\d+)\)")
        self.assertTrue(wait_for(lambda: ready.search(self.read("muster.err")) and
                                 os.path.exists(os.path.join(work, "pid.0.0")), 60),
                        self.read("muster.err"))
        interpreter = int(ready.search(self.read("muster.err")).group(1))
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
            os.kill(interpreter, sig)
        open(os.path.join(work, "fail.0.0"), "w").close()
        self.assertTrue(wait_for(lambda: os.path.exists(os.path.join(work, "pid.1.0")), 60),
                        self.read("muster.err"))
        self.assertTrue(pid_alive(interpreter), self.read("muster.err"))
        with open(os.path.join(work, "pid.1.0")) as f:
            worker = int(f.read())
        os.kill(worker, signal.SIGTERM)  # its own handler is the default one: it dies
        self.assertEqual(proc.wait(timeout=60), 1, self.read("muster.err"))
        self.assertIn("Signal 15 (SIGTERM)", self.read("muster.err"))
        self.assertEqual(counts(self.read("muster.err")), (2, 0), self.read("muster.err"))
        self.assertTrue(wait_for(lambda: not pid_alive(interpreter), 10), "it outlived the agent")

    def test_every_way_a_script_ends_shows_as_it_does_cold(self):
        # Each script's own lines (the traceback of what it raised, the
        # message of a syntax error) and how it ended, cold and forked.
        os.makedirs(self.path("app"))
        with open(self.path("app/__main__.py"), "w") as f:
            f.write("import sys\nprint('app', sys.argv[1:], sys.path[0])\n")
        with open(self.path("ends.py"), "w") as f:
            f.write(textwrap.dedent("""\
                import sys
                def deeper(how):
                    if how == "raise":
                        raise ValueError("from the script")
                    if how == "interrupt":
                        raise KeyboardInterrupt
                    sys.exit(int(how))
                deeper(sys.argv[1])
            """))
        with open(self.path("broken.py"), "w") as f:
            f.write("def f(:\n")
        cases = {"raise": ["ends.py", "raise"], "interrupt": ["ends.py", "interrupt"],
                 "exit": ["ends.py", "7"], "syntax": ["broken.py"], "directory": ["app", "x"],
                 "module": ["-m", "ends", "raise"], "safe path": ["ends.py", "0"]}
        for name, args in cases.items():
            extra = {"PYTHONSAFEPATH": "1"} if name == "safe path" else {}
            seen = {}
            for preload in ([], ["--preload", "json"]):
                result = self.launch("--standalone", "--nproc-per-node", "1", *preload, *args,
                                     cwd=self.tmp, PYTHONPATH=self.tmp if name == "module" else "",
                                     **extra)
                lines = [line for line in (result.stdout + result.stderr).splitlines()
                         if line.startswith("[rank 0]:")]
                failed = re.findall(r"failed: (.*); stopping", result.stderr)
                seen[bool(preload)] = (result.returncode, lines, failed)
                if preload:
                    self.assertEqual(counts(result.stderr), (1, 0), result.stderr)
            with self.subTest(name=name):
                self.assertEqual(seen[True], seen[False])
                self.assertNotIn("muster_preload", str(seen[True]))

    def test_a_module_that_fails_to_import_is_named_and_the_job_runs_cold(self):
        result = muster("--standalone", "--nproc-per-node", "2", "--preload", "json,no_such_mod",
                        PROBE, self.tmp)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("import no_such_mod failed: ModuleNotFoundError: No module named "
                      "'no_such_mod'; workers start cold", result.stderr)
        self.assertEqual(counts(result.stderr), (0, 2), result.stderr)
        self.assertEqual(len(self.probes(self.tmp)), 2)

    def test_a_failed_forked_worker_is_reported_as_a_cold_one(self):
        for mode, expected in (("raise", "RuntimeError: rank 1 raised on purpose"),
                               ("segv", "Signal 11 (SIGSEGV)"), ("exit1", "exit code 1")):
            with self.subTest(mode=mode):
                result = muster("--standalone", "--nproc-per-node", "2", "--preload", "torch",
                                os.path.join(WORKERS, "fail.py"), mode, "1")
                self.assertEqual(result.returncode, 1, result.stderr)
                self.assertIn(expected, result.stderr)
                if mode == "raise":  # faulthandler's dump of a SIGSEGV shows every frame
                    self.assertNotIn("muster_preload", result.stderr, "a frame of our own")
                self.assertEqual(counts(result.stderr), (2, 0), result.stderr)

    def test_no_python_and_bad_names(self):
        result = muster("--standalone", "--nproc-per-node", "1", "--preload", "torch",
                        "--no-python", "true")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("--preload torch: not used, as --no-python workers are not Python",
                      result.stderr)
        for bad in ("to rch", "torch,,numpy", "1torch", "torch.", "os;rm"):
            with self.subTest(bad=bad):
                result = muster("--standalone", "--preload", bad, PROBE, self.tmp)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn("is not a module name; give --preload MODULES", result.stderr)
        result = muster("--standalone", PROBE, self.tmp, MUSTER_PRELOAD="bad name")
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("MUSTER_PRELOAD='bad name'", result.stderr)
