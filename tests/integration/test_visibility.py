"""Seeing a job and its rendezvous from outside (issue 15): musterctl
against a real musterd and real agents on loopback."""
import json
import os
import signal
import stat
import time

from harness import ROOT, TempDirTest, muster, read_file, reserve_port, run, wait_for
from test_musterd import MUSTERD
from test_trust import TrustTest

MUSTERCTL = os.environ.get("MUSTERCTL", os.path.join(ROOT, "build", "ctl", "musterctl"))


class Health(TrustTest):
    """gRPC's health service (grpc.health.v1) on musterd's port, asked with
    musterctl health: SERVING while it serves, NOT_SERVING while it drains."""

    def health(self, port, *extra):
        return run([MUSTERCTL, "health", "--endpoint", f"127.0.0.1:{port}", "--timeout", "5",
                    *extra], timeout=30)

    def test_serving_then_not_serving_while_it_drains(self):
        token = self.token_file()
        musterd, port = self.start_musterd("--drain", "600", "--token-file", token)
        self.assertIn("health: grpc.health.v1", self.read("musterd.err"))
        # No credential: a load balancer's or Kubernetes' probe has none.
        result = self.health(port)
        self.assertEqual((result.returncode, result.stdout), (0, f"127.0.0.1:{port}: SERVING\n"),
                         result.stderr)

        musterd.send_signal(signal.SIGTERM)
        draining = lambda: "draining for 10m" in self.read("musterd.err")
        self.assertTrue(wait_for(draining, 15), self.read("musterd.err"))
        result = self.health(port)
        self.assertEqual((result.returncode, result.stdout),
                         (1, f"127.0.0.1:{port}: NOT_SERVING\n"), result.stderr)
        # Everything else is served as before: a whole job runs during the drain.
        outdir = self.path("during")
        agents = [self.start_agent(f"a{n}", port, "drained", "2", outdir, "--rdzv-conf",
                                   "is_host=0", MUSTER_TOKEN_FILE=token) for n in range(2)]
        for n, agent in enumerate(agents):
            code, err = self.finish(agent, f"a{n}")
            self.assertEqual(code, 0, err)
        self.assertEqual(sorted(os.listdir(outdir)), ["env.0", "env.1"])

        # A second signal ends the drain at once.
        self.assertIsNone(musterd.poll(), self.read("musterd.err"))
        started = time.monotonic()
        musterd.send_signal(signal.SIGTERM)
        code, log = self.finish(musterd, "musterd", timeout=15)
        self.assertEqual(code, 0, log)
        self.assertLess(time.monotonic() - started, 10, log)
        result = self.health(port)
        self.assertEqual(result.returncode, 1, result.stdout)
        self.assertIn(f"cannot ask 127.0.0.1:{port}", result.stderr)

    def test_without_drain_a_stop_is_at_once(self):
        musterd, port = self.start_musterd()
        self.assertEqual(self.health(port).returncode, 0)
        started = time.monotonic()
        musterd.send_signal(signal.SIGTERM)
        code, log = self.finish(musterd, "musterd", timeout=15)
        self.assertEqual(code, 0, log)
        self.assertLess(time.monotonic() - started, 5, log)
        self.assertNotIn("draining", log)

    def test_what_cannot_be_asked(self):
        _, port = self.start_musterd()
        result = self.health(port, "--service", "muster.rdzv.Rendezvous")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("service muster.rdzv.Rendezvous: SERVING", result.stdout)
        result = self.health(port, "--service", "nope")
        self.assertEqual(result.returncode, 1)
        self.assertIn("knows no service 'nope'", result.stderr)
        closed = reserve_port()  # bound, never listening: refused
        result = self.health(closed)
        self.assertEqual(result.returncode, 1)
        self.assertIn("not reachable", result.stderr)
        for args in ([], ["health"], ["health", "--endpoint", "a:b:c"],
                     ["health", "--endpoint", f"127.0.0.1:{port}", "--timeout", "0"],
                     ["health", "--endpoint", f"127.0.0.1:{port}", "--cert", "c.pem"],
                     ["bogus"]):
            with self.subTest(args=args):
                result = run([MUSTERCTL, *args], timeout=30)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertRegex(result.stderr, r"^musterctl: error: .+\n$")
        result = run([MUSTERCTL, "--help"], timeout=30)
        self.assertEqual(result.returncode, 0)
        self.assertIn("health", result.stdout)

    def test_a_bad_drain_is_a_usage_error(self):
        result = run([MUSTERD, "--drain", "soon"], timeout=10)
        self.assertEqual(result.returncode, 2)
        self.assertIn("--drain soon", result.stderr)


class EventLog(TempDirTest):
    """--rdzv-conf event_log=FILE: the agent's events appended to FILE, one
    JSON object a line: the same events --event-log-handler console prints."""

    FAILS_ONCE = '[ "$TORCHELASTIC_RESTART_COUNT" = 1 ] || [ "$RANK" = 1 ] || exit 3'

    def test_the_console_events_appended_to_the_file(self):
        log = self.path("events.jsonl")
        result = muster("--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                        "--event-log-handler", "console", "--rdzv-conf", f"event_log={log}",
                        "--no-python", "sh", "-c", self.FAILS_ONCE)
        self.assertEqual(result.returncode, 0, result.stderr)
        console = [json.loads(line) for line in result.stderr.splitlines()
                   if line.startswith("{")]
        written = [json.loads(line) for line in read_file(log).splitlines()]
        self.assertEqual(written, console)
        self.assertEqual([e["kind"] for e in written],
                         ["round_started", "worker_failed", "job_restarting", "round_started",
                          "job_closed", "agent_exited"])
        for event in written:
            self.assertEqual(sorted(event), ["detail", "job", "kind", "node", "round", "time"])
        self.assertEqual(stat.S_IMODE(os.stat(log).st_mode), 0o600)

        # Appended: a second job's events follow the first's, and without
        # the console handler nothing is printed, but the file still gets them.
        result = muster("--standalone", "--rdzv-conf", f"event_log={log}", "--no-python", "true")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertNotIn("{", result.stderr)
        lines = read_file(log).splitlines()
        self.assertEqual(len(lines), len(written) + 3)
        second = [json.loads(line) for line in lines[len(written):]]
        self.assertEqual([e["kind"] for e in second], ["round_started", "job_closed",
                                                       "agent_exited"])
        self.assertNotEqual(second[0]["job"], written[0]["job"])

    def test_a_file_that_cannot_be_opened(self):
        result = muster("--standalone", "--rdzv-conf",
                        f"event_log={self.path('no/such/dir/events.jsonl')}", "--no-python",
                        "true")
        self.assertEqual(result.returncode, 2)
        self.assertIn("event_log=", result.stderr)
        self.assertIn("cannot open", result.stderr)
        # Not through a link someone else may have left where the log goes.
        os.symlink(self.path("elsewhere"), self.path("link.jsonl"))
        result = muster("--standalone", "--rdzv-conf", f"event_log={self.path('link.jsonl')}",
                        "--no-python", "true")
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertFalse(os.path.exists(self.path("elsewhere")))
        os.mkfifo(self.path("fifo"))
        result = muster("--standalone", "--rdzv-conf", f"event_log={self.path('fifo')}",
                        "--no-python", "true", timeout=30)
        self.assertEqual(result.returncode, 2, result.stderr)

    def test_a_file_others_can_read_is_warned_about(self):
        log = self.path("open.jsonl")
        open(log, "w").close()
        os.chmod(log, 0o644)
        result = muster("--standalone", "--rdzv-conf", f"event_log={log}", "--no-python", "true")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("can be read by others (mode 644)", result.stderr)
        self.assertEqual(len(read_file(log).splitlines()), 3)
