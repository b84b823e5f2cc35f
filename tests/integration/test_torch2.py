"""PyTorch 2.x: muster against torchrun 2.6 in Debian trixie's root (issue
14) and against torchrun 2.14 in sid's (issue 34), both made by
scripts/torch2-root (torch2.py), as a user whose machine has only that
PyTorch runs them. Skipped, with the reason, where a root is not built
(scripts/setup builds them) or the tests do not run as root."""
import json
import os
import re
import shutil
import unittest

import torch2
from harness import DDP_TRAIN, HERE, WORKERS, TempDirTest, read_file

# What the two launchers give workers differently, each with why; every
# other variable either sets must be the same, or a per-run value checked
# on its own (TORCHRUN.md's way, as test_standalone.Environment does for 1.13).
EXPLAINED = {
    # torchrun 2.4+ shares its agent's TCPStore (True); muster's rank 0
    # hosts PyTorch's store on MASTER_PORT, which every 2.x worker accepts.
    "TORCHELASTIC_USE_AGENT_STORE": ("False", "True"),
    # The name before PyTorch 2.2; muster sets both, torchrun 2.x the new one.
    "NCCL_ASYNC_ERROR_HANDLING": ("1", None),
}
# torchrun 2.9+ sets it, as muster does (--signals-to-handle's default); 2.6 does not.
EXPLAINED_26 = {**EXPLAINED,
                "TORCHELASTIC_SIGNALS_TO_HANDLE": ("SIGTERM,SIGINT,SIGHUP,SIGQUIT", None)}
PER_RUN = {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"}
# muster's own, which torchrun has no counterpart of: where a worker may write its step.
MUSTER_ONLY = {"MUSTER_PROGRESS_FILE"}


class _Torch2:
    """muster and torchrun side by side in a PyTorch 2.x root; a subclass
    names ROOT."""

    ROOT = None
    EXPLAINED = EXPLAINED

    def setUp(self):
        super().setUp()
        for script in (DDP_TRAIN, os.path.join(WORKERS, "file_timer.py"),
                       os.path.join(WORKERS, "probe.py"), os.path.join(HERE, "torchrun_debian.py")):
            shutil.copy(script, self.tmp)

    def launch(self, launcher, *args, **extra_env):
        """muster (the bundle's) or this root's torchrun; CompletedProcess."""
        if launcher == "muster":
            command = ["/opt/muster/bin/muster", *args]
        elif launcher == "muster-preload":  # issue 33
            command = ["/opt/muster/bin/muster", "--preload", "torch", *args]
        else:
            command = ["/usr/bin/python3", self.path("torchrun_debian.py"), *args]
        return self.ROOT.run(command, self.bundle, self.tmp, torch2.root_env(**extra_env),
                             timeout=240)

    def test_ddp_parameters_equal_torchruns(self):
        params = {}
        for launcher in ("muster", "muster-preload", "torchrun"):
            for crash in (False, True):
                out = self.path(f"{launcher}.{crash}.json")
                extra = ["--crash-rank", "1", "--crash-marker",
                         self.path(f"{launcher}.crashed")] if crash else []
                # Debian's torchrun 2.x, restarting, hands its workers its own
                # store again, whose client asks for libuv that Debian's build
                # lacks ("use_libuv was requested"): its documented opt-out
                # makes rank 0 host the store instead, as under muster.
                opt_out = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} if launcher != "muster" else {}
                result = self.launch(launcher, "--standalone", "--nproc-per-node", "2",
                                     "--max-restarts", "1", self.path("ddp_train.py"),
                                     "--epochs", "2", "--out", out, *extra, **opt_out)
                self.assertEqual(result.returncode, 0, f"{launcher}: {result.stderr}")
                with open(out) as f:
                    record = json.load(f)
                self.assertEqual(record["restart_count"], 1 if crash else 0, launcher)
                params[launcher, crash] = record["params"]
        self.assertEqual(params["muster", False], params["torchrun", False])
        self.assertEqual(params["muster", True], params["torchrun", True])
        self.assertEqual(params["muster-preload", False], params["torchrun", False])
        self.assertEqual(params["muster-preload", True], params["torchrun", True])

    def test_a_preloaded_worker_is_what_a_cold_start_makes_on_this_python(self):
        probes = {}
        for launcher in ("muster", "muster-preload"):
            out = self.path(launcher)
            os.mkdir(out)
            result = self.launch(launcher, "--standalone", "--nproc-per-node", "2",
                                 self.path("probe.py"), out)
            self.assertEqual(result.returncode, 0, f"{launcher}: {result.stderr}")
            for rank in range(2):
                with open(os.path.join(out, f"probe.{rank}.0.json")) as f:
                    probes[launcher, rank] = json.loads(f.read().replace(out, "OUT"))
            if launcher == "muster-preload":
                self.assertIn("2 worker(s) forked from the preloaded interpreter, 0 started cold",
                              result.stderr)
        for rank in range(2):
            cold, warm = probes["muster", rank], probes["muster-preload", rank]
            for key in sorted(set(cold) | set(warm)):
                with self.subTest(rank=rank, key=key):
                    if key == "env":
                        for var in set(cold["env"]) | set(warm["env"]):
                            if var not in PER_RUN | {"MUSTER_PROGRESS_FILE"}:
                                self.assertEqual(cold["env"].get(var), warm["env"].get(var), var)
                    elif key not in ("random", "ppid"):
                        self.assertEqual(cold[key], warm[key])

    def environments(self, launcher):
        d = self.path(launcher)
        os.mkdir(d)
        result = self.launch(launcher, "--standalone", "--nproc-per-node", "2", "--max-restarts",
                             "2", "--no-python", "/bin/sh", "-c", f"env > {d}/env.$LOCAL_RANK")
        self.assertEqual(result.returncode, 0, f"{launcher}: {result.stderr}")
        return torch2.read_environments(d, 2)

    def test_environment_variable_by_variable(self):
        ours, theirs = self.environments("muster"), self.environments("torchrun")
        torch2.assert_same_environments(self, ours, theirs, self.EXPLAINED, PER_RUN, MUSTER_ONLY)
        for rank, a in enumerate(ours):
            self.assertTrue(a["TORCHELASTIC_ERROR_FILE"].endswith(f"/attempt_0/{rank}/error.json"))
            self.assertTrue(a["MUSTER_PROGRESS_FILE"].endswith(f"/attempt_0.{rank}"))
            self.assertEqual(a["MASTER_ADDR"], "127.0.0.1")

    def test_file_timer_of_this_torch(self):
        work = self.path("work")
        os.mkdir(work)
        # One worker: with two, the first expiry stops the other before its own.
        result = self.launch("muster", "--max-restarts", "1", self.path("file_timer.py"), "hang",
                             work, TORCHELASTIC_ENABLE_FILE_TIMER="1")
        self.assertEqual(result.returncode, 0, result.stderr)
        late = [float(x) for x in re.findall(
            r"file timer 'train_step' of pid \d+ expired ([\d.]+) s ago", result.stderr)]
        self.assertEqual(len(late), 1, result.stderr)
        self.assertLess(late[0], 1.5, result.stderr)
        self.assertTrue(os.path.exists(os.path.join(work, "start.1.0")), result.stderr)

    def test_log_line_prefix_of_torchs_variable_as_this_torchrun(self):
        # test_run.py's test_capture_logs_using_default_logs_specs, under both.
        for launcher in ("muster", "torchrun"):
            result = self.launch(launcher, "--standalone", "--nproc-per-node", "2", "--redirects",
                                 "3", "--tee", "3", "--local-ranks-filter", "1", "--no-python",
                                 "/bin/sh", "-c", 'echo "creating $RANK"',
                                 TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[rank${rank}]: ")
            self.assertEqual(result.returncode, 0, f"{launcher}: {result.stderr}")
            self.assertIn("[rank1]: creating 1", result.stdout, launcher)
            self.assertNotIn("creating 0", result.stdout, launcher)

    def test_log_files_as_this_torchrun(self):
        # --log-dir with --redirects 3 --tee 1: the same files under the run's
        # directory, holding the same lines; the console shows stdout only,
        # each line behind the launcher's prefix ([rank 0]: for muster,
        # [default0]: for torchrun; TORCHRUN.md).
        with open(self.path("both_streams.py"), "w") as f:
            f.write('import os, sys\nr = os.environ["RANK"]\n'
                    'print("out", r)\nprint("err", r, file=sys.stderr)\n')
        files, console = {}, {}
        for launcher in ("muster", "torchrun"):
            logs = self.path(f"logs-{launcher}")
            result = self.launch(launcher, "--standalone", "--nproc-per-node", "2", "--log-dir",
                                 logs, "--redirects", "3", "--tee", "1",
                                 self.path("both_streams.py"))
            self.assertEqual(result.returncode, 0, f"{launcher}: {result.stderr}")
            (run,) = os.listdir(logs)
            run = os.path.join(logs, run)
            files[launcher] = {os.path.relpath(os.path.join(d, name), run):
                               read_file(os.path.join(d, name))
                               for d, _, names in os.walk(run) for name in names}
            console[launcher] = sorted(
                re.fullmatch(r"\[(?:rank |default)(\d)\]: ?(.*)", line).groups()
                for line in result.stdout.splitlines())
            self.assertNotIn("err ", result.stderr, launcher)
        self.assertEqual(files["muster"], files["torchrun"])
        self.assertEqual(files["muster"]["attempt_0/1/stderr.log"], "err 1\n")
        self.assertEqual(console["muster"], console["torchrun"])
        self.assertEqual(console["muster"], [("0", "out 0"), ("1", "out 1")])


@unittest.skipIf(torch2.TORCH26.available(), torch2.TORCH26.available())
class Torch26(_Torch2, torch2.WithBundle, TempDirTest):
    """Debian trixie's PyTorch 2.6, Python 3.13."""

    ROOT = torch2.TORCH26
    EXPLAINED = EXPLAINED_26


@unittest.skipIf(torch2.TORCH214.available(), torch2.TORCH214.available())
class Torch214(_Torch2, torch2.WithBundle, TempDirTest):
    """Debian sid's PyTorch 2.14, Python 3.14."""

    ROOT = torch2.TORCH214


if __name__ == "__main__":
    unittest.main()
