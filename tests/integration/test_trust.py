"""Issue 11, the shared token: a rendezvous with a token answers no call
without it. Real musterd and muster agents on loopback, and an outsider with
rdzv-call (tests/tools/rdzv_call.cc) who knows the job's id, its config and
its nodes' ids, but not the token."""
import glob
import os
import re
import time
import unittest

from certificates import make_certificates, openssl_missing
from harness import MUSTER, MUSTERD, read_env, reserve_port, run, wait_for
from test_musterd import MusterdTest

JOB = "guarded"
NODE_ID = re.compile(r"joining job '[^']*' at \S+ as node (\S+)")
NO_TOKEN_WARNING = "no rendezvous token: anyone who can reach"


class TrustTest(MusterdTest):
    def token_file(self, name="token", token="0123456789abcdef0123456789abcdef", mode=0o600):
        path = self.path(name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        os.chmod(path, mode)
        return path

    def agent(self, name, endpoint, outdir, *conf, nnodes="2", job=JOB, **extra_env):
        """An agent whose workers record their environment, then wait for outdir/go."""
        os.makedirs(outdir, exist_ok=True)
        # Written whole, then renamed: a record is never read half written.
        record = f"{outdir}/env.$RANK.$TORCHELASTIC_RESTART_COUNT"
        script = (f"env > {record}.tmp && mv {record}.tmp {record}; i=0; "
                  f"while [ ! -e {outdir}/go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); "
                  f"done; [ -e {outdir}/go ]")
        return self.spawn(name, [
            MUSTER, "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", job,
            "--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-conf", ",".join(conf),
            "--no-python", "sh", "-c", script], **extra_env)

    def records(self, outdir):
        """{(rank, restart): environment} of every worker start so far."""
        out = {}
        for path in glob.glob(f"{outdir}/env.*.*[0-9]"):  # not the .tmp being written
            _, rank, restart = os.path.basename(path).split(".")
            out[(int(rank), int(restart))] = read_env(path)
        return out


class TokenAuth(TrustTest):
    """musterd --token-file and agents with the token: the job runs; an outsider without
    the token can neither read, join, stall nor stop it."""

    def test_outsider_without_the_token_cannot_touch_a_running_job(self):
        token = self.token_file()
        _, port = self.start_musterd("--token-file", token)
        self.assertIn(f"auth: token from {token}", self.read("musterd.err"))
        outdir = self.path("out")
        agents = [self.agent(f"n{n}", f"127.0.0.1:{port}", outdir, "is_host=0",
                             f"token_file={token}", MUSTER_LOG_LEVEL="debug") for n in range(2)]
        self.assertTrue(wait_for(lambda: len(self.records(outdir)) == 2, 30),
                        self.read("n0.err") + self.read("n1.err"))
        before = self.records(outdir)
        node_ids = [NODE_ID.search(self.read(f"n{n}.err")).group(1) for n in range(2)]
        for n in range(2):
            self.assertIn("(auth: token)", self.read(f"n{n}.err"))
            self.assertNotIn(NO_TOKEN_WARNING, self.read(f"n{n}.err"))

        # With the token, the outsider's tool works: the attacks below can fail.
        code, message, answers = self.call(port, "Status", {"jobId": JOB}, "--token-file", token)
        self.assertEqual(code, "OK", message)
        self.assertEqual(answers[0]["state"], "running")
        self.assertEqual(answers[0]["participants"], 2)

        wrong = self.token_file("wrong", "ffffffffffffffffffffffffffffffff")
        victim = node_ids[0]
        config = {"minNodes": 2, "maxNodes": 2, "maxRestarts": 0, "lastCallTimeoutMs": "30000",
                  "joinTimeoutMs": "600000", "heartbeatTimeoutMs": "30000"}
        attacks = [
            ("Status", {"jobId": JOB}),
            ("Status", {"jobId": "no-such-job"}),
            ("Watch", {"jobId": JOB, "nodeId": victim}),
            ("Join", {"jobId": JOB, "config": config,
                      "node": {"nodeId": "evil", "host": "evil", "localWorldSize": 1,
                               "nodeRankHint": 0, "masterPortCandidate": 1}}),
            ("Heartbeat", {"jobId": JOB, "nodeId": victim}),
            ("ReportFailure", {"jobId": JOB, "nodeId": victim, "round": "0",
                               "failure": {"rank": 0, "host": "evil", "exitCode": 1}}),
            ("ReportDone", {"jobId": JOB, "nodeId": victim, "round": "0"}),
            ("Leave", {"jobId": JOB, "nodeId": victim, "reason": "evil"}),
            ("ListJobs", {}),
            ("Stop", {"jobId": JOB, "reason": "evil"}),
            ("WatchJob", {"jobId": JOB}),
        ]
        messages = set()
        attacked = time.monotonic()
        for credential in ([], ["--token-file", wrong], ["--token", "guessed-0123456789"],
                           ["--authorization", open(token).read().strip()]):
            for method, request in attacks:
                with self.subTest(method=method, credential=credential):
                    code, message, answers = self.call(port, method, request, *credential)
                    self.assertEqual(code, "UNAUTHENTICATED", message)
                    self.assertEqual(answers, [], "a refused call answered something")
                    self.assertNotIn(JOB, message)
                    messages.add(message)
        self.assertEqual(len(messages), 1, messages)
        # Each refusal logged with the caller's address, a few lines a second at most.
        log = self.read("musterd.err")
        self.assertIn("refused a Status call from ipv4:127.0.0.1:", log)
        refusals = log.count("refused a ")
        # (That every refusal is logged when calls come slower than that, under
        # a sanitizer or a loaded machine, is right: log_limiter_test checks the bound.)
        self.assertLessEqual(refusals, 10 * (int(time.monotonic() - attacked) + 2), log)

        open(os.path.join(outdir, "go"), "w").close()
        for n, agent in enumerate(agents):
            code, err = self.finish(agent, f"n{n}")
            self.assertEqual(code, 0, err)
            self.assertNotIn("round 1", err)
        after = self.records(outdir)
        self.assertEqual(sorted(after), [(0, 0), (1, 0)], "a worker was restarted")
        for key, worker in after.items():
            self.assertEqual(worker["TORCHELASTIC_RESTART_COUNT"], "0")
            self.assertEqual(worker["WORLD_SIZE"], "2")
            for var in ("RANK", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"):
                self.assertEqual(worker[var], before[key][var], var)
        self.assertNotIn("evil", self.read("musterd.err"))

    def test_hosting_agent_serves_with_the_token(self):
        token = self.token_file()
        port = reserve_port()
        outdir = self.path("out")
        # ha=0: the hosting agent's own server (the job's etcd: test_multinode.OwnEtcd).
        host = self.agent("host", f"127.0.0.1:{port}", outdir, "is_host=1", "ha=0",
                          f"token_file={token}")
        other = self.agent("other", f"127.0.0.1:{port}", outdir, "is_host=0",
                           MUSTER_TOKEN_FILE=token)
        self.assertTrue(wait_for(lambda: len(self.records(outdir)) == 2, 30),
                        self.read("host.err") + self.read("other.err"))
        self.assertIn(f"on port {port} (auth: token)", self.read("host.err"))
        code, message, _ = self.call(port, "Status", {"jobId": JOB})
        self.assertEqual(code, "UNAUTHENTICATED", message)
        code, message, _ = self.call(port, "Status", {"jobId": JOB}, "--token-file", token)
        self.assertEqual(code, "OK", message)
        open(os.path.join(outdir, "go"), "w").close()
        for name, agent in [("host", host), ("other", other)]:
            code, err = self.finish(agent, name)
            self.assertEqual(code, 0, err)
            self.assertNotIn(NO_TOKEN_WARNING, err)

    def test_agent_with_a_wrong_token_or_none_exits_at_once(self):
        token = self.token_file()
        wrong = self.token_file("wrong", "ffffffffffffffffffffffffffffffff")
        _, port = self.start_musterd("--token-file", token)
        for name, conf, says in [
                ("wrong", [f"token_file={wrong}"],
                 f"the rendezvous at 127.0.0.1:{port} refused our credential: the token in "
                 f"{wrong} is not the one musterd --token-file"),
                ("none", [], f"the rendezvous at 127.0.0.1:{port} requires a token and this "
                             "agent has none")]:
            with self.subTest(name):
                started = time.monotonic()
                agent = self.agent(name, f"127.0.0.1:{port}", self.path(f"out-{name}"), "is_host=0",
                                   "join_timeout=60", *conf)
                code, err = self.finish(agent, name, timeout=30)
                self.assertNotEqual(code, 0, err)
                self.assertLess(time.monotonic() - started, 10, "the agent retried: " + err)
                self.assertIn(says, err)
                self.assertEqual(glob.glob(self.path(f"out-{name}/env.*")), [])


class TokenFiles(TrustTest):
    """A token file others can read is refused, by agents and by musterd, with the fix."""

    def test_agent_refuses_a_token_file_of_mode_0644(self):
        token = self.token_file(mode=0o644)
        port = reserve_port()
        for how, extra, env in [("rdzv-conf", ["--rdzv-conf", f"is_host=0,token_file={token}"],
                                 {}),
                                ("env", ["--rdzv-conf", "is_host=0"], {"MUSTER_TOKEN_FILE": token})]:
            with self.subTest(how):
                result = run([MUSTER, "--rdzv-backend", "c10d", "--rdzv-endpoint",
                              f"127.0.0.1:{port}", "--rdzv-id", JOB, *extra, "--no-python",
                              "true"], timeout=30, **env)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn(f"token file {token} has mode 0644", result.stderr)
                self.assertIn(f"chmod 600 {token}", result.stderr)

    def test_musterd_refuses_a_token_file_of_mode_0644_or_one_too_short(self):
        loose = self.token_file("loose", mode=0o644)
        result = run([MUSTERD, "--port", "0", "--token-file", loose], timeout=20)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertRegex(result.stderr, r"^musterd: error: --token-file: .+\n$")
        self.assertIn(f"token file {loose} has mode 0644", result.stderr)
        self.assertIn(f"chmod 600 {loose}", result.stderr)
        short = self.token_file("short", "tiny")
        result = run([MUSTERD, "--port", "0", "--token-file", short], timeout=20)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("under the 16", result.stderr)
        result = run([MUSTERD, "--port", "0", "--token-file", self.path("absent")],
                     timeout=20)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("does not exist", result.stderr)


class NoToken(TrustTest):
    """No token anywhere: the job runs as before, and each agent warns once."""

    def test_job_runs_and_each_agent_warns_once(self):
        _, port = self.start_musterd()
        self.assertIn("auth: none", self.read("musterd.err"))
        outdir = self.path("out")
        agents = [self.agent(f"n{n}", f"127.0.0.1:{port}", outdir, "is_host=0")
                  for n in range(2)]
        self.assertTrue(wait_for(lambda: len(self.records(outdir)) == 2, 30),
                        self.read("n0.err") + self.read("n1.err"))
        open(os.path.join(outdir, "go"), "w").close()
        for n, agent in enumerate(agents):
            code, err = self.finish(agent, f"n{n}")
            self.assertEqual(code, 0, err)
            self.assertEqual(err.count(NO_TOKEN_WARNING), 1, err)
            self.assertIn("(auth: none)", err)
            self.assertIn("--rdzv-conf token_file=PATH", err)

    def test_standalone_listens_nowhere_and_does_not_warn(self):
        result = run([MUSTER, "--standalone", "--no-python", "true"], timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertNotIn(NO_TOKEN_WARNING, result.stderr)


@unittest.skipIf(openssl_missing(), openssl_missing() or "")
class Tls(TrustTest):
    """musterd --tls-* with a token, agents with cacert/cert/key: the job runs over
    mutual TLS; a plaintext client is refused, and TLS without the token is still
    UNAUTHENTICATED; certificates that do not check out are named to the user."""

    def setUp(self):
        super().setUp()
        os.makedirs(self.path("pki"))
        self.pki = make_certificates(self.path("pki"), ["127.0.0.1"])

    def tls_conf(self, ca="ca.pem", client=True):
        conf = [f"cacert={self.pki[ca]}"]
        if client:
            conf += [f"cert={self.pki['client.pem']}", f"key={self.pki['client.key']}"]
        return conf

    def start_tls_musterd(self, *args, client_certificates=True, name="musterd"):
        tls = ["--tls-cert", self.pki["server.pem"], "--tls-key", self.pki["server.key"]]
        if client_certificates:
            tls += ["--tls-cacert", self.pki["ca.pem"]]
        return self.start_musterd(*tls, *args, name=name)

    def test_job_runs_over_mutual_tls_and_plaintext_is_refused(self):
        token = self.token_file()
        _, port = self.start_tls_musterd("--token-file", token)
        self.assertIn("tls: on (client certificates required)", self.read("musterd.err"))
        outdir = self.path("out")
        agents = [self.agent(f"n{n}", f"127.0.0.1:{port}", outdir, "is_host=0",
                             f"token_file={token}", *self.tls_conf()) for n in range(2)]
        self.assertTrue(wait_for(lambda: len(self.records(outdir)) == 2, 30),
                        self.read("n0.err") + self.read("n1.err"))
        for n in range(2):
            self.assertIn("(auth: token, tls)", self.read(f"n{n}.err"))

        client = ["--cacert", self.pki["ca.pem"], "--cert", self.pki["client.pem"], "--key",
                  self.pki["client.key"]]
        # The outsider's tool with everything gets through: the refusals below can fail.
        code, message, answers = self.call(port, "Status", {"jobId": JOB}, "--token-file", token,
                                           *client)
        self.assertEqual(code, "OK", message)
        self.assertEqual(answers[0]["participants"], 2)
        # Plaintext, token and all: no connection.
        code, message, answers = self.call(port, "Status", {"jobId": JOB}, "--token-file", token)
        self.assertEqual(code, "UNAVAILABLE", message)
        # TLS without a client certificate: no connection either.
        code, message, _ = self.call(port, "Status", {"jobId": JOB}, "--token-file", token,
                                     "--cacert", self.pki["ca.pem"])
        self.assertEqual(code, "UNAVAILABLE", message)
        # Mutual TLS is not the token: without it, every call is refused as before.
        for method, request in [("Status", {"jobId": JOB}),
                                ("Leave", {"jobId": JOB, "nodeId": "x", "reason": "evil"})]:
            with self.subTest(method):
                code, message, answers = self.call(port, method, request, *client)
                self.assertEqual(code, "UNAUTHENTICATED", message)
                self.assertEqual(answers, [])

        open(os.path.join(outdir, "go"), "w").close()
        for n, agent in enumerate(agents):
            code, err = self.finish(agent, f"n{n}")
            self.assertEqual(code, 0, err)
            self.assertNotIn("round 1", err)
        self.assertEqual(sorted(self.records(outdir)), [(0, 0), (1, 0)])

    def test_hosting_agent_serves_tls(self):
        token = self.token_file()
        port = reserve_port()
        outdir = self.path("out")
        server = [f"cert={self.pki['server.pem']}", f"key={self.pki['server.key']}",
                  f"cacert={self.pki['ca.pem']}"]
        host = self.agent("host", f"127.0.0.1:{port}", outdir, "is_host=1", f"token_file={token}",
                          *server)
        other = self.agent("other", f"127.0.0.1:{port}", outdir, "is_host=0",
                           f"token_file={token}", *self.tls_conf())
        self.assertTrue(wait_for(lambda: len(self.records(outdir)) == 2, 30),
                        self.read("host.err") + self.read("other.err"))
        self.assertIn(f"on port {port} (auth: token, tls)", self.read("host.err"))
        code, message, _ = self.call(port, "Status", {"jobId": JOB}, "--token-file", token)
        self.assertEqual(code, "UNAVAILABLE", message)
        open(os.path.join(outdir, "go"), "w").close()
        for name, agent in [("host", host), ("other", other)]:
            code, err = self.finish(agent, name)
            self.assertEqual(code, 0, err)

    def test_certificates_that_do_not_check_out_are_named(self):
        _, port = self.start_tls_musterd()
        for name, conf, says in [
                ("other-ca", self.tls_conf("other-ca.pem"),
                 f"TLS: check that {self.pki['other-ca.pem']} signed the server's certificate "
                 "and that it names 127.0.0.1"),
                ("no-client-cert", self.tls_conf(client=False),
                 "give cert=PATH,key=PATH if it does")]:
            with self.subTest(name):
                agent = self.agent(name, f"127.0.0.1:{port}", self.path(f"out-{name}"),
                                   "is_host=0", "join_timeout=4", *conf)
                code, err = self.finish(agent, name, timeout=30)
                self.assertNotEqual(code, 0, err)
                # The wait says it while it waits, and the end says it again.
                self.assertIn(f"waiting for the rendezvous at 127.0.0.1:{port}", err)
                self.assertGreaterEqual(err.count(says), 2, err)
                self.assertEqual(glob.glob(self.path(f"out-{name}/env.*")), [])

    def test_half_a_pair_is_a_usage_error_that_names_the_fix(self):
        port = reserve_port()
        cert, key = self.pki["client.pem"], self.pki["client.key"]
        for conf, says in [([f"cacert={self.pki['ca.pem']}", f"cert={cert}"],
                            "TLS needs cert and key together: give both"),
                           ([f"cert={cert}", f"key={key}"], "give cacert=PATH")]:
            with self.subTest(conf):
                result = run([MUSTER, "--rdzv-backend", "c10d", "--rdzv-endpoint",
                              f"127.0.0.1:{port}", "--rdzv-id", JOB, "--rdzv-conf",
                              ",".join(["is_host=0", *conf]), "--no-python", "true"], timeout=30)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn("rendezvous TLS (--rdzv-conf cacert, cert, key): ", result.stderr)
                self.assertIn(says, result.stderr)
        # A hosting agent needs a certificate to serve with.
        result = run([MUSTER, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                      "--rdzv-id", JOB, "--rdzv-conf", f"is_host=1,cacert={self.pki['ca.pem']}",
                      "--no-python", "true"], timeout=30)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("it has no certificate to serve with: give --rdzv-conf cert=PATH,key=PATH",
                      result.stderr)
        for args, says in [(["--tls-cert", self.pki["server.pem"]], "--tls-cert needs --tls-key"),
                           (["--tls-key", self.pki["server.key"]], "--tls-key needs --tls-cert"),
                           (["--tls-cacert", self.pki["ca.pem"]],
                            "--tls-cacert needs --tls-cert and --tls-key")]:
            with self.subTest(args):
                result = run([MUSTERD, "--port", "0", *args], timeout=20)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn(says, result.stderr)
        os.chmod(self.pki["server.key"], 0o644)
        result = run([MUSTERD, "--port", "0", "--tls-cert", self.pki["server.pem"], "--tls-key",
                      self.pki["server.key"]], timeout=20)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn(f"chmod 600 {self.pki['server.key']}", result.stderr)

    def test_musterd_without_tls_says_so(self):
        # musterd says how it serves before its "serving" line, which start_musterd waits for.
        _, port = self.start_musterd("--token-file", self.token_file())
        self.assertIn("tls: off (the token crosses the network in clear text",
                      self.read("musterd.err"))
        _, port = self.start_tls_musterd(client_certificates=False, name="plain-clients")
        self.assertIn("tls: on (client certificates not required)",
                      self.read("plain-clients.err"))


if __name__ == "__main__":
    unittest.main()
