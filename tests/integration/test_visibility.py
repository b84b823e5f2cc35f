"""Seeing a job and its rendezvous from outside (issue 15): musterctl
against a real musterd and real agents on loopback."""
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import time

from harness import (MUSTER, ROOT, OnDemandWorkers, TempDirTest, muster, pid_alive, read_file,
                     reserve_port, run, wait_for)
from test_musterd import MUSTERD
from test_trust import TrustTest

MUSTERCTL = os.environ.get("MUSTERCTL", os.path.join(ROOT, "build", "ctl", "musterctl"))


METRICS_URL = re.compile(r"metrics: (http://\S+/metrics)")
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """Prometheus' text format: {(name, sorted label pairs): value}."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample: {line!r}"
        labels = tuple(sorted(LABEL.findall(match.group(2) or "")))
        samples[(match.group(1), labels)] = float(match.group(3))
    return samples


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


class Scraping:
    """For a test with self.token (the job's token file), self.read and
    self.logs(): the metrics of a process that logged their URL."""

    def scrape(self, name):
        """The samples at the /metrics that `name` (musterd, a0, ...) logged,
        by (metric, labels); the text passes promtool check metrics."""
        found = wait_for(lambda: METRICS_URL.search(self.read(f"{name}.err")), 30)
        self.assertTrue(found, f"{name} logged no metrics URL:\n{self.logs()}")
        url = METRICS_URL.search(self.read(f"{name}.err")).group(1)
        # The job's token guards them: HTTP basic auth, the token as password.
        refused = run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", url], timeout=30)
        self.assertEqual(refused.stdout, "401", refused.stderr)
        wrong = run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--user",
                     "muster:guess", url], timeout=30)
        self.assertEqual(wrong.stdout, "401", wrong.stderr)
        curl = run(["curl", "-sSf", "--max-time", "10", "--user",
                    f"muster:{read_file(self.token).strip()}", url], timeout=30)
        self.assertEqual(curl.returncode, 0, curl.stderr)
        check = subprocess.run(["promtool", "check", "metrics"], input=curl.stdout, text=True,
                               capture_output=True, timeout=60)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr + curl.stdout)
        return parse_metrics(curl.stdout)


class JobView(TrustTest, OnDemandWorkers, Scraping):
    """musterctl status, watch and stop, and musterd --event-log, against a
    real musterd (with a token) and real agents whose workers the test ends."""

    JOB = "seen"

    def setUp(self):
        super().setUp()
        self.work = self.path("work")
        os.makedirs(self.work)
        self.token = self.token_file()
        self.events = self.path("musterd-events.jsonl")
        self.musterd, self.port = self.start_musterd("--token-file", self.token, "--event-log",
                                                     self.events, "--metrics-port", "0")
        self.agents = []

    def logs(self):
        return "\n".join(f"--- {name}\n{self.read(name + '.err')}"
                         for name in ["musterd"] + [f"a{n}" for n in range(len(self.agents))])

    def start_agents(self, count, nnodes="3", max_restarts="1"):
        for _ in range(count):
            name = f"a{len(self.agents)}"
            self.agents.append(self.spawn(name, [
                MUSTER, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.port}",
                "--rdzv-id", self.JOB, "--nnodes", nnodes, "--max-restarts", max_restarts,
                "--nproc-per-node", "1", "--rdzv-conf", "is_host=0,metrics_port=0",
                self.ON_DEMAND, self.work],
                MUSTER_TOKEN_FILE=self.token))

    def ctl(self, *args, token=True, timeout=30):
        extra = {"MUSTER_TOKEN_FILE": self.token} if token else {}
        return run([MUSTERCTL, args[0], "--endpoint", f"127.0.0.1:{self.port}", *args[1:]],
                   timeout=timeout, **extra)

    def status(self):
        result = self.ctl("status", self.JOB, "--json")
        self.assertIn(result.returncode, (0, 1), result.stderr)
        return json.loads(result.stdout)

    def test_status_and_watch_of_a_job_that_fails_once_then_finishes(self):
        self.start_agents(1)
        self.assertTrue(wait_for(lambda: self.ctl("status", self.JOB).returncode == 0, 30),
                        self.logs())
        watch_out = open(self.path("watch.out"), "w")
        watch = subprocess.Popen(
            [MUSTERCTL, "watch", "--endpoint", f"127.0.0.1:{self.port}", self.JOB, "--json"],
            env=dict(os.environ, MUSTER_TOKEN_FILE=self.token), stdout=watch_out,
            stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: watch.poll() is None and watch.kill())
        self.start_agents(2)
        pids = self.pids(0, ranks=3)

        # Running: 3 nodes, round 0, no restart used.
        job = first = self.status()
        self.assertEqual((job["job"], job["state"], job["round"], job["nodes"], job["restarts"],
                          job["max_restarts"], job["world_size"]),
                         (self.JOB, "running", 0, 3, 0, 1, 3), job)
        self.assertEqual([n["group_rank"] for n in job["node_list"]], [0, 1, 2])
        self.assertEqual([n["rank_base"] for n in job["node_list"]], [0, 1, 2])
        self.assertEqual({n["state"] for n in job["node_list"]}, {"running"})
        self.assertTrue(all(n["watching"] and n["host"] and n["joined"] <= n["last_seen"]
                            for n in job["node_list"]), job)
        self.assertEqual((job["recent_failures"], job["root_cause"], job["succeeded"]),
                         ([], None, None))
        table = self.ctl("status", self.JOB)
        self.assertEqual(table.returncode, 0, table.stderr)
        self.assertIn(f"job {self.JOB}: running, round 0", table.stdout)
        self.assertIn("restarts 0/1", table.stdout)
        self.assertEqual(len([line for line in table.stdout.splitlines()
                              if " running " in line]), 3, table.stdout)
        listed = self.ctl("status")
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertRegex(listed.stdout, rf"(?m)^{self.JOB} +running +0 +3 +3:3 +0/1 +3 ")

        # A worker fails: the restart is used, and the failure is named.
        self.fail_rank(1, 0)
        self.pids(1, ranks=3)
        job = self.status()
        self.assertEqual((job["state"], job["round"], job["restarts"]), ("running", 1, 1), job)
        self.assertEqual(len(job["recent_failures"]), 1, job)
        failure = job["recent_failures"][0]
        self.assertEqual((failure["rank"], failure["exit_code"], failure["signal"]), (1, 1, 0))
        self.assertEqual(failure["pid"], pids[1])
        self.assertIn("restarts 1/1", self.ctl("status", self.JOB).stdout)

        self.finish_workers()
        for n, agent in enumerate(self.agents):
            code, err = self.finish(agent, f"a{n}")
            self.assertEqual(code, 0, err)
        self.assertEqual(watch.wait(timeout=30), 0, watch.stderr.read())
        watch_out.close()
        watched = [json.loads(line) for line in read_file(self.path("watch.out")).splitlines()]
        self.assertEqual([e["kind"] for e in watched],
                         ["node_joined"] * 3 + ["round_started", "worker_failed", "round_started",
                                                "job_closed"], watched)
        self.assertEqual([e["round"] for e in watched], [0, 0, 0, 0, 0, 1, 1])
        self.assertEqual(len({e["node"] for e in watched[:3]}), 3)
        self.assertEqual(watched[4]["node"], first["node_list"][1]["node_id"])  # rank 1's
        self.assertIn("rank 1 on ", watched[4]["detail"])
        self.assertIn("restart 1 of 1", watched[4]["detail"])
        self.assertEqual(watched[-1]["detail"], "succeeded: every node finished")

        # The event log: one JSON object a line, the same events.
        lines = read_file(self.events).splitlines()
        self.assertEqual([json.loads(line) for line in lines], watched)
        self.assertEqual(stat.S_IMODE(os.stat(self.events).st_mode), 0o600)

        # The closed job: its status says so, and a watch replays its events and ends.
        job = self.status()
        self.assertEqual((job["state"], job["succeeded"], job["close_reason"]),
                         ("closed", True, "every node finished"))
        replay = self.ctl("watch", self.JOB)
        self.assertEqual(replay.returncode, 0, replay.stderr)
        self.assertEqual(len(replay.stdout.splitlines()), 7, replay.stdout)
        self.assertRegex(replay.stdout.splitlines()[-1],
                         r"round 1 +job_closed +succeeded: every node finished$")

    def check_dashboard(self, scraped):
        """examples/grafana-muster.json asks only for metrics that were scraped,
        in queries promtool parses (as recording rules, Grafana's variables
        given values)."""
        with open(os.path.join(ROOT, "examples", "grafana-muster.json")) as f:
            dashboard = json.load(f)
        exprs = [target["expr"] for panel in dashboard["panels"]
                 for target in panel.get("targets", [])]
        self.assertGreaterEqual(len(exprs), 10)
        for expr in exprs:
            for name in re.findall(r"\b(muster_[a-z_]+)", expr):
                self.assertIn(name, scraped, expr)
        rules = self.path("dashboard-rules.yml")
        with open(rules, "w") as f:
            f.write("groups:\n- name: dashboard\n  rules:\n")
            for n, expr in enumerate(exprs):
                expr = expr.replace("$__rate_interval", "5m").replace("$job_id", ".*")
                f.write(f"  - record: dashboard:query{n}\n    expr: {json.dumps(expr)}\n")
        check = run(["promtool", "check", "rules", rules], timeout=60)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)

    def test_metrics_during_a_job_that_fails_once_then_finishes(self):
        if shutil.which("promtool") is None:
            self.skipTest("no promtool (Debian's prometheus package; scripts/setup installs it)")
        self.start_agents(3)
        self.pids(0, ranks=3)
        job = (("job_id", self.JOB),)
        server = self.scrape("musterd")
        self.assertEqual(server[("muster_rendezvous_jobs", (("state", "running"),))], 1)
        self.assertEqual(server[("muster_rendezvous_jobs", (("state", "open"),))], 0)
        self.assertEqual(server[("muster_rendezvous_nodes", job)], 3)
        self.assertEqual(server[("muster_rendezvous_rounds_total", job + (("reason", "start"),))], 1)
        self.assertEqual(server[("muster_rendezvous_restarts_total", job)], 0)
        self.assertEqual(server[("muster_rendezvous_rpcs_total",
                                 (("code", "OK"), ("method", "Join")))], 3)
        self.assertEqual(server[("muster_rendezvous_join_seconds_count", ())], 3)
        self.assertEqual(server[("muster_rendezvous_join_seconds_bucket", (("le", "+Inf"),))], 3)
        self.assertEqual(server[("muster_rendezvous_auth_failures_total", ())], 0)
        # A call without the token is an auth failure, counted as such.
        self.assertEqual(self.ctl("status", self.JOB, token=False).returncode, 1)
        server = self.scrape("musterd")
        self.assertEqual(server[("muster_rendezvous_auth_failures_total", ())], 1)
        self.assertEqual(server[("muster_rendezvous_rpcs_total",
                                 (("code", "UNAUTHENTICATED"), ("method", "Status")))], 1)
        for n in range(3):
            agent = self.scrape(f"a{n}")
            self.assertEqual(agent[("muster_agent_workers_running", job)], 1)
            self.assertEqual(agent[("muster_agent_round", job)], 0)
            self.assertEqual(agent[("muster_agent_restarts_total", job)], 0)
            self.assertEqual(agent[("muster_agent_worker_failures_total", job)], 0)
            self.assertGreater(agent[("muster_agent_round_seconds", job)], 0)

        # Rank 1 fails: a restart, a round opened for it, and one agent's failure.
        self.fail_rank(1, 0)
        self.pids(1, ranks=3)
        server = self.scrape("musterd")
        self.assertEqual(server[("muster_rendezvous_rounds_total",
                                 job + (("reason", "worker_failed"),))], 1)
        self.assertEqual(server[("muster_rendezvous_restarts_total", job)], 1)
        self.assertEqual(server[("muster_rendezvous_join_seconds_count", ())], 6)
        agents = [self.scrape(f"a{n}") for n in range(3)]
        self.assertEqual(sorted(a[("muster_agent_worker_failures_total", job)] for a in agents),
                         [0, 0, 1])
        failed = next(a for a in agents if a[("muster_agent_worker_failures_total", job)] == 1)
        self.assertEqual(failed[("muster_agent_worker_exit_code", job + (("local_rank", "0"),))], 1)
        for agent in agents:
            self.assertEqual(agent[("muster_agent_round", job)], 1)
            self.assertEqual(agent[("muster_agent_restarts_total", job)], 1)
            self.assertEqual(agent[("muster_agent_workers_running", job)], 1)

        self.check_dashboard({name for name, _ in server} | {name for a in agents for name, _ in a})

        self.finish_workers()
        for n, agent in enumerate(self.agents):
            code, err = self.finish(agent, f"a{n}")
            self.assertEqual(code, 0, err)
        server = self.scrape("musterd")
        self.assertEqual(server[("muster_rendezvous_jobs", (("state", "closed"),))], 1)
        self.assertEqual(server[("muster_rendezvous_jobs", (("state", "running"),))], 0)

    def test_stop_ends_a_running_job(self):
        self.start_agents(3)
        pids = self.pids(0, ranks=3)
        # Without the job's token: refused, and the job runs on.
        refused = self.ctl("stop", self.JOB, token=False)
        self.assertEqual(refused.returncode, 1)
        self.assertIn("refused the call", refused.stderr)
        self.assertIn("--token-file", refused.stderr)
        self.assertEqual(self.status()["state"], "running")
        unknown = self.ctl("stop", "no-such-job")
        self.assertEqual(unknown.returncode, 1)
        self.assertIn("no job 'no-such-job'", unknown.stderr)

        stopped = self.ctl("stop", self.JOB, "--reason", "node maintenance at 3am")
        self.assertEqual(stopped.returncode, 0, stopped.stderr)
        for n, agent in enumerate(self.agents):
            code, err = self.finish(agent, f"a{n}", timeout=60)
            self.assertEqual(code, 1, err)
            self.assertIn("stopped by an operator: node maintenance at 3am", err)
        for rank, pid in pids.items():
            self.assertFalse(pid_alive(pid), f"rank {rank} (pid {pid}) outlived the stop")
        self.assertIn("job 'seen' stopped by ", self.read("musterd.err"))

        job = self.status()
        self.assertEqual((job["state"], job["succeeded"]), ("closed", False))
        self.assertEqual(job["close_reason"], "stopped by an operator: node maintenance at 3am")
        self.assertEqual(self.ctl("status", self.JOB).returncode, 1)  # a job that failed
        again = self.ctl("stop", self.JOB)
        self.assertEqual(again.returncode, 1)
        self.assertIn("closed already", again.stderr)
        kinds = [json.loads(line)["kind"] for line in read_file(self.events).splitlines()]
        self.assertEqual(kinds, ["node_joined"] * 3 + ["round_started", "job_closed"])

    def test_what_cannot_be_asked(self):
        for args in (["status", self.JOB], ["watch", self.JOB]):
            with self.subTest(args=args):
                result = self.ctl(*args)
                self.assertEqual(result.returncode, 1)
                self.assertEqual(result.stderr,
                                 f"musterctl: no job '{self.JOB}' on 127.0.0.1:{self.port}\n")
        result = self.ctl("status", token=False)
        self.assertEqual(result.returncode, 1)
        self.assertIn("refused the call", result.stderr)
        result = self.ctl("status", "--token-file", self.token_file("wrong", "f" * 32))
        self.assertEqual(result.returncode, 1)
        self.assertIn("refused the call", result.stderr)
        result = self.ctl("status")
        self.assertEqual((result.returncode, result.stdout), (0, "no jobs\n"), result.stderr)
        self.assertEqual(json.loads(self.ctl("status", "--json").stdout), {"jobs": [], "total": 0})
        closed = reserve_port()
        result = run([MUSTERCTL, "status", "--endpoint", f"127.0.0.1:{closed}"], timeout=30)
        self.assertEqual(result.returncode, 1)
        self.assertIn("not reachable", result.stderr)
        for args in (["watch"], ["stop"], ["status", "--munge", "--token-file", self.token],
                     ["status", "--token-file", self.path("missing")],
                     ["status", "--munge-socket", "/x"]):
            with self.subTest(args=args):
                result = run([MUSTERCTL, args[0], "--endpoint", f"127.0.0.1:{self.port}",
                              *args[1:]], timeout=30)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertRegex(result.stderr, r"^musterctl: error: .+\n$")
        result = run([MUSTERD, "--event-log", self.path("no/such/dir/events")], timeout=10)
        self.assertEqual(result.returncode, 2)
        self.assertIn("--event-log=", result.stderr)

    def test_metrics_settings_that_cannot_be_used(self):
        password = self.token_file("metrics-password", "m" * 32)
        for args, problem in [
            # Plain HTTP beyond loopback would carry the job's token in clear.
            (["--token-file", self.token, "--metrics-listen", "0.0.0.0"],
             "give --metrics-password-file FILE"),
            (["--metrics-listen", "::1"], "has no IPv6"),
            (["--metrics-listen", "localhost"], "give an IPv4 address"),
            (["--metrics-password-file", self.path("missing")], "--metrics-password-file: "),
        ]:
            with self.subTest(args=args):
                result = run([MUSTERD, "--port", "0", "--metrics-port", "0", *args], timeout=30)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn(problem, result.stderr)
        result = run([MUSTERD, "--port", "0", "--metrics-password-file", password], timeout=30)
        self.assertEqual(result.returncode, 2)
        self.assertIn("need --metrics-port", result.stderr)
        # The agent's, the same rules.
        result = run([MUSTER, "--rdzv-backend", "c10d", "--rdzv-endpoint",
                      f"127.0.0.1:{self.port}", "--rdzv-id", "x", "--rdzv-conf",
                      "is_host=0,metrics_port=0,metrics_listen=0.0.0.0", self.ON_DEMAND,
                      self.work], timeout=30, MUSTER_TOKEN_FILE=self.token)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("give --rdzv-conf metrics_password_file FILE", result.stderr)

    def test_metrics_with_a_password_of_their_own(self):
        password = self.token_file("metrics-password", "m" * 32)
        proc, _ = self.start_musterd("--metrics-port", "0", "--metrics-listen", "0.0.0.0",
                                     "--metrics-password-file", password, "--token-file",
                                     self.token, name="musterd2")
        url = METRICS_URL.search(self.read("musterd2.err")).group(1)
        url = url.replace("0.0.0.0", "127.0.0.1")
        with_token = run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--user",
                          f"muster:{read_file(self.token).strip()}", url], timeout=30)
        self.assertEqual(with_token.stdout, "401", "the job's token is not the metrics' password")
        with_password = run(["curl", "-sSf", "--user", f"muster:{'m' * 32}", url], timeout=30)
        self.assertEqual(with_password.returncode, 0, with_password.stderr)
        self.assertIn("muster_rendezvous_jobs{", with_password.stdout)


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
