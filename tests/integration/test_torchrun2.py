"""torchrun 2.x's command line under muster (issue 14): the options PyTorch
added after 1.13, argparse's abbreviations and torchrun's --rdzv-conf keys,
each checked by its effect on a real job. Cases that translate tests of
PyTorch's own test/distributed/launcher/test_run.py say which."""
import glob
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import unittest

from harness import (MUSTER, TempDirTest, WORKERS, muster, pid_alive, read_env, read_file,
                     reserve_port, wait_for)

# test_run.py's bin/test_script.sh: says what it creates, then creates it.
TOUCH_SH = 'echo "creating $1/$RANK"; touch "$1/$RANK"'


class Abbreviations(TempDirTest):
    """An unambiguous start of a long option is that option, as argparse has it."""

    def test_abbreviated_options_run_the_job(self):
        # test_run.py's test_capture_logs_using_default_logs_specs spells --redirect=3.
        result = muster("--standalone", "--nproc", "2", "--redirect=3", "--log-d", self.tmp,
                        "--no-py", "sh", "-c", TOUCH_SH, "sh", self.tmp)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertTrue(os.path.exists(self.path("0")) and os.path.exists(self.path("1")))
        # --redirect=3: the lines went to the files, not the console.
        self.assertNotIn("creating", result.stdout)
        logs = glob.glob(os.path.join(self.tmp, "*", "attempt_0", "1", "stdout.log"))
        self.assertEqual(len(logs), 1, os.listdir(self.tmp))
        self.assertIn(f"creating {self.tmp}/1", read_file(logs[0]))

    def test_ambiguous_abbreviation_is_a_usage_error(self):
        result = muster("--rdzv", "x", "--no-python", "true")
        self.assertEqual(result.returncode, 2)
        self.assertIn("ambiguous option --rdzv: it could be --rdzv-backend, --rdzv-endpoint",
                      result.stderr)


class RdzvConf(TempDirTest):
    """torchrun's --rdzv-conf keys, and one nobody reads."""

    def test_torchs_own_elastic_launch(self):
        # test_run.py's test_launch_elastic: its quotes reach torchrun as part of the value.
        port = reserve_port()
        result = muster("--nnodes=1:2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                        f"--rdzv-endpoint=localhost:{port}",
                        "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'",
                        "--no-python", "sh", "-c", TOUCH_SH, "sh", self.tmp)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(sorted(os.listdir(self.tmp)), ["0", "1"])
        self.assertIn("ignoring the unknown key '\\'join_timeout'", result.stderr)

    def test_unknown_key_is_one_warning_line(self):
        result = muster("--standalone", "--rdzv-conf", "colour=blue,use_libuv=0,store_type=tcp",
                        "--no-python", "true")
        self.assertEqual(result.returncode, 0, result.stderr)
        warnings = [line for line in result.stderr.splitlines() if "warning" in line]
        self.assertEqual(len(warnings), 1, result.stderr)
        self.assertIn("ignoring the unknown key colour", warnings[0])

    def test_a_key_that_is_an_option(self):
        result = muster("--rdzv-conf", "local_addr=10.0.0.1", "--no-python", "true")
        self.assertEqual(result.returncode, 2)
        self.assertIn("give --local-addr instead", result.stderr)


class LogLinePrefix(TempDirTest):
    """--log-line-prefix-template and TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE."""

    def test_torchs_variable(self):
        # test_run.py's test_capture_logs_using_default_logs_specs.
        result = muster("--standalone", "--nproc-per-node", "4", "--redirect=3", "--tee=3",
                        "--no-python", "sh", "-c", TOUCH_SH, "sh", self.tmp,
                        TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[rank${rank}]: ")
        self.assertEqual(result.returncode, 0, result.stderr)
        for rank in range(4):
            self.assertIn(f"[rank{rank}]: creating {self.tmp}/{rank}\n", result.stdout)

    def test_the_flag_wins_and_every_name_is_filled_in(self):
        template = "${role_name}|${rank}|${local_rank}|${pid}|${hostname}|$$|${other}> "
        result = muster("--standalone", "--nproc-per-node", "2", "--role", "trainer",
                        "--log-line-prefix-template", template, "--no-python", "sh", "-c",
                        'echo "pid $$$$"',
                        TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[rank${rank}]: ")
        self.assertEqual(result.returncode, 0, result.stderr)
        host = socket.gethostname()
        lines = sorted(result.stdout.splitlines())
        self.assertEqual(len(lines), 2, result.stdout)
        for rank, line in enumerate(lines):
            prefix, pid = line.split("> pid ")
            self.assertEqual(prefix, f"trainer|{rank}|{rank}|{pid}|{host}|$|${{other}}")


class DuplicateFilters(TempDirTest):
    """Lines holding a filter also go to attempt_<n>/filtered_std{out,err}.log."""

    def test_matching_lines_of_every_rank_are_copied(self):
        script = ('echo "loss=1.$RANK"; echo "acc, top-1"; echo "boring"; '
                  'echo "NCCL WARN $RANK" >&2; echo "quiet" >&2')
        result = muster("--standalone", "--nproc-per-node", "2", "--log-dir", self.tmp,
                        "--local-ranks-filter", "0",
                        "--duplicate-stdout-filters", "loss,acc,, top",
                        "--duplicate_stderr_filters=NCCL WARN", "--no-python", "sh", "-c", script)
        self.assertEqual(result.returncode, 0, result.stderr)
        attempt = glob.glob(os.path.join(self.tmp, "*", "attempt_0"))
        self.assertEqual(len(attempt), 1, os.listdir(self.tmp))
        out = sorted(read_file(os.path.join(attempt[0], "filtered_stdout.log")).splitlines())
        err = sorted(read_file(os.path.join(attempt[0], "filtered_stderr.log")).splitlines())
        # Rank 1 is not shown on the console, yet its lines are copied.
        self.assertEqual(out, ["[rank 0]: acc, top-1", "[rank 0]: loss=1.0",
                               "[rank 1]: acc, top-1", "[rank 1]: loss=1.1"])
        self.assertEqual(err, ["[rank 0]: NCCL WARN 0", "[rank 1]: NCCL WARN 1"])
        self.assertNotIn("[rank 1]", result.stdout)


class SignalsToHandle(TempDirTest):
    """--signals-to-handle: which signals stop the job; the rest only reach the workers."""

    def start_workers(self, *options):
        proc = self.start("--standalone", "--nproc-per-node", "2", "--shutdown-timeout", "5",
                          *options, os.path.join(WORKERS, "signals.py"), self.tmp,
                          "--ignore-term", "--seconds", "60")
        def pids_written():
            files = [p for p in glob.glob(self.path("pid.*")) if not p.endswith(".tmp")]
            return len(files) == 2 and [int(read_file(p)) for p in files]
        pids = wait_for(pids_written, timeout=30)
        self.assertTrue(pids, "workers did not start: " + self.read("muster.err"))
        return proc, pids

    def test_a_listed_sigusr1_stops_the_job_and_sigusr2_left_out_is_only_forwarded(self):
        proc, pids = self.start_workers("--signals-to-handle", "SIGUSR1,SIGINT")
        proc.send_signal(signal.SIGUSR2)
        got_usr2 = wait_for(lambda: all(os.path.exists(self.path(f"SIGUSR2.{r}"))
                                        for r in range(2)), timeout=10)
        self.assertTrue(got_usr2, self.read("muster.err"))
        proc.send_signal(signal.SIGUSR1)
        # The workers get SIGUSR1 itself, which does not end them: SIGKILL after the 5 s grace.
        self.assertEqual(proc.wait(timeout=30), 128 + signal.SIGUSR1, self.read("muster.err"))
        for rank in range(2):
            self.assertTrue(os.path.exists(self.path(f"SIGUSR1.{rank}")), f"rank {rank}")
        for pid in pids:
            self.assertFalse(pid_alive(pid))
        self.assertIn("received SIGUSR1: stopping 2 worker(s)", self.read("muster.err"))

    def test_sigterm_left_out_ends_muster_and_its_workers_at_once(self):
        proc, pids = self.start_workers("--signals-to-handle", "SIGUSR1")
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=10), -signal.SIGTERM, self.read("muster.err"))
        # No grace: they die with their parent, SIGTERM never reaching them.
        self.assertTrue(wait_for(lambda: not any(pid_alive(pid) for pid in pids), timeout=10))
        self.assertFalse(os.path.exists(self.path("SIGTERM.0")))

    def test_the_workers_are_told_which(self):
        result = muster("--standalone", "--signals_to_handle=SIGTERM,SIGUSR2", "--no-python",
                        "sh", "-c", f"env > {self.tmp}/env")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(read_env(self.path("env"))["TORCHELASTIC_SIGNALS_TO_HANDLE"],
                         "SIGTERM,SIGUSR2")
        result = muster("--standalone", "--no-python", "sh", "-c", f"env > {self.tmp}/env")
        self.assertEqual(read_env(self.path("env"))["TORCHELASTIC_SIGNALS_TO_HANDLE"],
                         "SIGTERM,SIGINT,SIGHUP,SIGQUIT")

    def test_a_name_muster_cannot_handle(self):
        result = muster("--signals-to-handle", "SIGKILL", "--no-python", "true")
        self.assertEqual(result.returncode, 2)
        self.assertIn("SIGKILL is not a signal muster can handle", result.stderr)


class VirtualLocalRank(TempDirTest):
    """--virtual-local-rank: LOCAL_RANK=0, CUDA_VISIBLE_DEVICES narrowed to one device."""

    def dump(self, *options, **extra_env):
        result = muster("--standalone", "--nproc-per-node", "2", *options, "--no-python",
                        "sh", "-c", f'env > {self.tmp}/env.$RANK', **extra_env)
        self.assertEqual(result.returncode, 0, result.stderr)
        return [read_env(self.path(f"env.{rank}")) for rank in range(2)]

    def test_each_worker_sees_its_own_device(self):
        for rank, e in enumerate(self.dump("--virtual-local-rank",
                                           CUDA_VISIBLE_DEVICES="5,7")):
            self.assertEqual(e["LOCAL_RANK"], "0")
            self.assertEqual(e["CUDA_VISIBLE_DEVICES"], ["5", "7"][rank])
            self.assertEqual(e["RANK"], str(rank))
        for rank, e in enumerate(self.dump("--virtual-local-rank")):
            self.assertEqual(e["CUDA_VISIBLE_DEVICES"], str(rank))
        for rank, e in enumerate(self.dump(CUDA_VISIBLE_DEVICES="5,7")):
            self.assertEqual(e["LOCAL_RANK"], str(rank))
            self.assertEqual(e["CUDA_VISIBLE_DEVICES"], "5,7")

    def test_too_few_devices_is_a_usage_error(self):
        result = muster("--standalone", "--nproc-per-node", "2", "--virtual-local-rank",
                        "--no-python", "true", CUDA_VISIBLE_DEVICES="3")
        self.assertEqual(result.returncode, 2)
        self.assertIn("names 1 for 2 workers", result.stderr)


class NumaBinding(TempDirTest):
    """--numa-binding: each worker bound to the CPUs near its GPU, as sysfs tells."""

    def fake_sysfs(self):
        """This host's CPUs 0 and 1 as two NUMA nodes on two sockets, a GPU on each."""
        root = self.path("sysfs")
        def write(path, text):
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text + "\n")
        for n in range(2):
            write(f"devices/system/node/node{n}/cpulist", str(n))
            write(f"devices/system/cpu/cpu{n}/topology/physical_package_id", str(n))
            write(f"devices/system/cpu/cpu{n}/topology/thread_siblings_list", str(n))
            gpu = f"bus/pci/devices/0000:0{n + 1}:00.0"
            write(f"{gpu}/vendor", "0x10de")
            write(f"{gpu}/class", "0x030200")
            write(f"{gpu}/numa_node", str(n))
        return root

    def test_each_worker_runs_on_its_gpus_node(self):
        if len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0):
            self.skipTest("needs CPUs 0 and 1")
        script = f"grep Cpus_allowed_list /proc/self/status > {self.tmp}/cpus.$LOCAL_RANK"
        for mode in ("node", "socket", "exclusive"):
            result = muster("--standalone", "--nproc-per-node", "2", "--numa-binding", mode,
                            "--no-python", "sh", "-c", script, MUSTER_SYSFS=self.fake_sysfs())
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertIn(f"--numa-binding {mode}: local rank 0 CPUs 0, memory of node(s) 0; "
                          "local rank 1 CPUs 1, memory of node(s) 1", result.stderr)
            for rank in range(2):
                self.assertEqual(read_file(self.path(f"cpus.{rank}")).split(),
                                 ["Cpus_allowed_list:", str(rank)], mode)

    def test_a_host_without_a_gpu_says_so_and_runs_unbound(self):
        result = muster("--standalone", "--numa-binding", "node", "--no-python", "sh", "-c",
                        f"grep Cpus_allowed_list /proc/self/status > {self.tmp}/cpus",
                        MUSTER_SYSFS=self.path("empty"))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("--numa-binding node: no NVIDIA GPU in", result.stderr)
        self.assertIn("the workers run unbound", result.stderr)
        allowed = sorted(os.sched_getaffinity(0))
        self.assertIn(str(allowed[-1]), read_file(self.path("cpus")))


class LogsSpecs(TempDirTest):
    """--logs-specs: torchrun's default layout is muster's only one."""

    def test_default_runs_and_any_other_is_refused(self):
        result = muster("--standalone", "--logs_specs=default", "--no-python", "true")
        self.assertEqual(result.returncode, 0, result.stderr)
        # test_run.py's test_logs_logs_spec_entrypoint_must_be_defined.
        result = muster("--standalone", "--logs_specs=DOESNOT_EXIST", "--no-python", "true")
        self.assertEqual(result.returncode, 2)
        self.assertIn("muster has one layout, torchrun's default", result.stderr)


class PrintCompletion(TempDirTest):
    """--print-completion SHELL: a completion script each shell loads."""

    def bash_complete(self, *words):
        """What bash offers for the last of `words` (muster's own script loaded)."""
        return sorted(self.bash_complete_lines(*words))

    def bash_complete_lines(self, *words):
        """bash_complete's candidates, one a line, as bash holds them."""
        script = muster("--print-completion", "bash").stdout
        with open(self.path("muster.bash"), "w") as f:
            f.write(script)
        array = " ".join(shlex.quote(w) for w in ("muster", *words))
        shell = (f"source {shlex.quote(self.path('muster.bash'))}; COMP_WORDS=({array}); "
                 f"COMP_CWORD={len(words)}; _muster; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
        result = subprocess.run(["bash", "--norc", "-c", shell], cwd=self.tmp, capture_output=True,
                                text=True, timeout=30)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr, "")
        # printf prints one empty line for no candidates.
        return [line for line in result.stdout.splitlines() if line]

    def test_bash_completes_options_choices_and_the_scripts_files(self):
        open(self.path("train.py"), "w").close()
        os.mkdir(self.path("logs"))
        self.assertEqual(self.bash_complete("--rdzv-b"), ["--rdzv-backend"])
        self.assertEqual(self.bash_complete("--no-"), ["--no-python"])
        self.assertEqual(self.bash_complete("--rdzv-backend", "c"), ["c10d"])
        # --opt=value, which bash splits at the '='.
        self.assertEqual(self.bash_complete("--rdzv_backend", "=", "e"), ["etcd"])
        self.assertEqual(self.bash_complete("--numa-binding", ""),
                         ["core-complex", "exclusive", "node", "socket"])
        self.assertEqual(self.bash_complete("--log-dir", ""), ["logs"])
        self.assertEqual(self.bash_complete("--nnodes", ""), [], "a value to type")
        self.assertEqual(self.bash_complete("--nproc-per-node", "4", "tr"), ["train.py"])
        # After the script every word is the script's: no options offered.
        self.assertEqual(self.bash_complete("--standalone", "train.py", "--no"), [])
        self.assertEqual(self.bash_complete("-r", "3", "train.py", "lo"), ["logs"])
        # Values bash splits at ':' and '=' are still one value.
        self.assertEqual(self.bash_complete("--nnodes", "1", ":", "2", "--rdzv-b"),
                         ["--rdzv-backend"])
        self.assertEqual(self.bash_complete("--rdzv-conf", "join_timeout", "=", "5", "--no-"),
                         ["--no-python"])
        self.assertEqual(self.bash_complete("--rdzv-endpoint", "=", "node1", ":", "29400", "tr"),
                         ["train.py"])

    def test_bash_keeps_a_file_name_whole(self):
        open(self.path("my data.py"), "w").close()
        open(self.path("[ab].py"), "w").close()
        open(self.path("a.py"), "w").close()
        self.assertEqual(self.bash_complete_lines("my"), ["my data.py"])
        self.assertEqual(self.bash_complete_lines("["), ["[ab].py"])

    @unittest.skipUnless(shutil.which("zsh"), "no zsh (scripts/setup installs it)")
    def test_zsh_registers_it(self):
        script = muster("--print-completion", "zsh").stdout
        with open(self.path("muster.zsh"), "w") as f:
            f.write(script)
        result = subprocess.run(
            ["zsh", "-f", "-c", f"source {shlex.quote(self.path('muster.zsh'))}; "
             "print -r -- ${_comps[muster]}"], capture_output=True, text=True, timeout=30)
        self.assertEqual((result.returncode, result.stderr), (0, ""))
        self.assertIn("-F _muster", result.stdout)

    @unittest.skipUnless(shutil.which("tcsh"), "no tcsh (scripts/setup installs it)")
    def test_tcsh_loads_it_with_eval(self):
        result = subprocess.run(
            ["tcsh", "-f", "-c", f'eval "`{MUSTER} --print-completion tcsh`"; complete muster'],
            capture_output=True, text=True, timeout=30)
        self.assertEqual((result.returncode, result.stderr), (0, ""))
        self.assertIn("'n/--rdzv-backend/(static c10d muster etcd)/'", result.stdout)
        self.assertIn("'n/--log-dir/d/'", result.stdout)

    def test_an_unknown_shell(self):
        result = muster("--print-completion", "fish")
        self.assertEqual(result.returncode, 2)
        self.assertIn("bash, zsh and tcsh", result.stderr)


class EventLogHandler(TempDirTest):
    """--event-log-handler console: the agent's events, one JSON object a line."""

    def test_a_job_that_fails_once_then_succeeds(self):
        script = '[ "$TORCHELASTIC_RESTART_COUNT" = 1 ] || [ "$RANK" = 1 ] || exit 3'
        result = muster("--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                        "--event-log-handler", "console", "--no-python", "sh", "-c", script)
        self.assertEqual(result.returncode, 0, result.stderr)
        events = []
        for line in result.stderr.splitlines():
            if line.startswith("{"):
                events.append(json.loads(line))
        kinds = [e["kind"] for e in events]
        self.assertEqual(kinds, ["round_started", "worker_failed", "job_restarting",
                                 "round_started", "job_closed", "agent_exited"], result.stderr)
        self.assertEqual(events[4]["detail"], "every node finished")
        self.assertEqual([e["round"] for e in events][:4], [0, 0, 1, 1])
        self.assertIn("rank 0 (local rank 0", events[1]["detail"])
        self.assertIn("exit code 3", events[1]["detail"])
        self.assertEqual(events[-1]["detail"], "exit code 0")
        self.assertEqual(len({e["job"] for e in events}), 1)
        self.assertEqual(len({e["node"] for e in events}), 1)

    def test_null_prints_none(self):
        result = muster("--standalone", "--event-log-handler", "null", "--no-python", "true")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertNotIn("{", result.stderr)


if __name__ == "__main__":
    unittest.main()
