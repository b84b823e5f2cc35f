"""Issue 11, what a token does not stop, and what needs no credential at all:
an insider who holds the job's token but is not one of its nodes, and an
outsider who floods or overfeeds a rendezvous that has no credential. Real
musterd and muster agents on loopback; the attacker is rdzv-call and
rdzv-flood (tests/tools), clients of proto/rendezvous.proto of our own."""
import json
import os
import re
import signal
import socket
import subprocess
import time
import unittest

from harness import MUSTER, RDZV_CALL, RDZV_FLOOD, ROOT, run, wait_for
from test_trust import NODE_ID, TrustTest

# The version this build speaks (rendezvous/rules/protocol.h), as an agent sends it.
with open(os.path.join(ROOT, "rendezvous", "rules", "protocol.h")) as _header:
    PROTOCOL_VERSION = int(re.search(r"kProtocolVersion = (\d+);", _header.read()).group(1))

JOB = "guarded"


class AttackTest(TrustTest):
    def worker_agent(self, name, port, outdir, *conf, max_restarts="1", **extra_env):
        """An agent of JOB (2 nodes) whose workers record their environment, then wait for
        outdir/go; rank 1 of the first attempt exits 1 once outdir/fail exists."""
        os.makedirs(outdir, exist_ok=True)
        # Written whole, then renamed: a record is never read half written.
        record = f"{outdir}/env.$RANK.$TORCHELASTIC_RESTART_COUNT"
        script = (f"env > {record}.tmp && mv {record}.tmp {record}; i=0; "
                  f"while [ ! -e {outdir}/go ] && [ $i -lt 600 ]; do "
                  f"if [ -e {outdir}/fail ] && [ $RANK = 1 ] && "
                  f"[ $TORCHELASTIC_RESTART_COUNT = 0 ]; then exit 1; fi; "
                  f"sleep 0.1; i=$((i+1)); done; [ -e {outdir}/go ]")
        return self.spawn(name, [
            MUSTER, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", JOB, "--nnodes", "2", "--nproc-per-node", "1",
            "--max-restarts", max_restarts, "--rdzv-conf", ",".join(("is_host=0",) + conf),
            "--no-python", "sh", "-c", script], **extra_env)

    def flood(self, port, *args, timeout=120):
        """rdzv-flood's ({code: count}, first message of each code)."""
        result = run([RDZV_FLOOD, "--target", f"127.0.0.1:{port}", *args], timeout=timeout)
        counts, messages = {}, {}
        for line in result.stdout.splitlines():
            fields = line.split("\t")
            if fields[0] != "seconds":
                counts[int(fields[0])] = int(fields[1])
                messages[int(fields[0])] = fields[2] if len(fields) > 2 else ""
        self.assertTrue(counts, result.stdout + result.stderr)
        return counts, messages


class Insider(AttackTest):
    """2: the token lets a caller in, not speak for a node: an insider with the token
    cannot report, leave, beat or watch for a member's node id, nor take a rejoining
    member's seat."""

    def test_insider_cannot_speak_for_a_member_nor_take_its_seat(self):
        token = self.token_file()
        _, port = self.start_musterd("--token-file", token)
        outdir = self.path("out")
        agents = [self.worker_agent(f"n{n}", port, outdir, f"token_file={token}",
                                    MUSTER_LOG_LEVEL="debug") for n in range(2)]
        self.assertTrue(wait_for(lambda: len(self.records(outdir)) == 2, 30),
                        self.read("n0.err") + self.read("n1.err"))
        before = self.records(outdir)
        victim = NODE_ID.search(self.read("n0.err")).group(1)
        with_token = ["--token-file", token]

        forged = [
            ("Heartbeat", {"jobId": JOB, "nodeId": victim}),
            ("Heartbeat", {"jobId": JOB, "nodeId": victim, "nodeSecret": "00" * 16}),
            ("Heartbeat", {"jobId": JOB, "nodeId": victim,
                           "progress": {"round": "0", "step": "999999999"}}),
            ("ReportFailure", {"jobId": JOB, "nodeId": victim, "round": "0",
                               "failure": {"rank": 0, "host": "evil", "exitCode": 1}}),
            ("ReportDone", {"jobId": JOB, "nodeId": victim, "round": "0"}),
            ("Leave", {"jobId": JOB, "nodeId": victim, "reason": "evil"}),
            ("Watch", {"jobId": JOB, "nodeId": victim}),
            ("Join", {"jobId": JOB, "protocolVersion": PROTOCOL_VERSION,
                      "config": {"minNodes": 2, "maxNodes": 2, "maxRestarts": 1,
                                 "lastCallTimeoutMs": "30000", "joinTimeoutMs": "600000",
                                 "heartbeatTimeoutMs": "30000",
                                 "maxNodeFailures": 3},  # --max-node-failures' default
                      "node": {"nodeId": victim, "host": "evil", "localWorldSize": 1,
                               "nodeRankHint": 0, "masterPortCandidate": 1}}),
        ]
        for method, request in forged:
            with self.subTest(method=method, request=request):
                code, message, answers = self.call(port, method, request, *with_token)
                self.assertEqual(code, "PERMISSION_DENIED", message)
                self.assertEqual(answers, [])
        code, message, answers = self.call(port, "Status", {"jobId": JOB}, *with_token)
        self.assertEqual(code, "OK", message)
        self.assertEqual((answers[0]["state"], answers[0]["round"], answers[0]["restartCount"]),
                         ("running", "0", 0))

        # A join that says its GPUs failed their check, with the members' host
        # and a 100 kB fault: refused, and the members' host is not excluded.
        sick = dict(forged[-1][1], healthFault="x" * 100_000)
        sick["node"] = dict(sick["node"], nodeId="evil-sick", host=socket.gethostname())
        code, message, answers = self.call(port, "Join", sick, *with_token)
        self.assertEqual(code, "FAILED_PRECONDITION", message)
        self.assertLess(len(message), 1_000)
        code, message, answers = self.call(port, "Status", {"jobId": JOB}, *with_token)
        self.assertEqual((answers[0]["state"], answers[0].get("excluded", [])), ("running", []))

        # The insider waits as a spare for the next round of the fixed-size job ...
        spare_request = dict(forged[-1][1])
        spare_request["node"] = dict(spare_request["node"], nodeId="evil-spare", nodeRankHint=-1)
        spare = subprocess.Popen(
            [RDZV_CALL, "--target", f"127.0.0.1:{port}", "--timeout", "60", *with_token, "Join",
             json.dumps(spare_request)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: spare.poll() is None and spare.kill())
        self.assertTrue(wait_for(lambda: self.call(port, "Status", {"jobId": JOB}, *with_token)[2]
                                 [0]["waiting"] == 1, 10), "the spare's join did not arrive")
        # ... and a real worker failure opens it: the members keep their seats.
        open(os.path.join(outdir, "fail"), "w").close()
        self.assertTrue(wait_for(lambda: len(self.records(outdir)) == 4, 30),
                        self.read("n0.err") + self.read("n1.err") + self.read("musterd.err"))
        open(os.path.join(outdir, "go"), "w").close()
        for n, agent in enumerate(agents):
            code, err = self.finish(agent, f"n{n}")
            self.assertEqual(code, 0, err)
        out, err = spare.communicate(timeout=30)
        self.assertNotEqual(spare.returncode, 0, f"the spare got a seat: {out}{err}")
        self.assertNotIn("assignment", out)

        after = self.records(outdir)
        self.assertEqual(sorted(after), [(0, 0), (0, 1), (1, 0), (1, 1)])
        for rank in range(2):
            restarted = after[(rank, 1)]
            self.assertEqual(restarted["TORCHELASTIC_RESTART_COUNT"], "1")
            self.assertEqual(restarted["WORLD_SIZE"], "2")
            for var in ("MASTER_ADDR", "GROUP_RANK", "ROLE_RANK"):
                self.assertEqual(restarted.get(var), before[(rank, 0)].get(var), var)
        code, message, answers = self.call(port, "Status", {"jobId": JOB}, *with_token)
        self.assertEqual((answers[0]["state"], answers[0]["restartCount"]), ("closed", 1))
        log = self.read("musterd.err")
        self.assertIn("it does not carry the node's secret", log)
        self.assertNotIn("evil-spare joined", log.replace("evil-spare joined while", ""))


PEER_PORT = re.compile(r"ask this node on UDP port (\d+)")


def field(number, payload):
    """One length-delimited protobuf field (wire type 2)."""
    def varint(n):
        out = b""
        while True:
            low, n = n & 0x7F, n >> 7
            out += bytes([low | (0x80 if n else 0)])
            if not n:
                return out
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def varint_field(number, value):
    return bytes([number << 3]) + bytes([value])  # small values only


class PeerQuestions(AttackTest):
    """Issue 35: the UDP port where the nodes of a round ask each other, while
    the rendezvous is away, whether they are in the round still. Without the
    round's key (Assignment.peer_key) an outsider gets no answer, and forged
    replies that say a newer round started stop no worker."""

    def forged(self):
        question = field(1, field(1, JOB.encode()) + varint_field(2, 0) +
                         field(3, b"evil") + field(4, b"n" * 16))
        reply = field(2, field(1, JOB.encode()) + varint_field(2, 0) + field(3, b"evil") +
                      field(4, b"n" * 32) + varint_field(5, 99))
        return [
            b"",
            b"\x00" * 64,
            os.urandom(1500),
            b"\xff" * 60_000,  # larger than any datagram it reads
            field(1, question) + field(2, b"\x00" * 32),  # a question under a made-up MAC
            field(1, question),  # no MAC at all
            field(1, reply) + field(2, os.urandom(32)),  # "round 99 started"
        ]

    def test_an_outsider_gets_no_answer_and_cannot_stop_a_riding_out_node(self):
        musterd, port = self.start_musterd()
        outdir = self.path("out")
        agents = [self.worker_agent(f"n{n}", port, outdir, "keep_alive_interval=0.5",
                                    "heartbeat_timeout=30", MUSTER_LOG_LEVEL="debug")
                  for n in range(2)]
        self.assertTrue(wait_for(lambda: len(self.records(outdir)) == 2, 30),
                        self.read("n0.err") + self.read("n1.err"))
        ports = [int(PEER_PORT.search(self.read(f"n{n}.err")).group(1)) for n in range(2)]
        attacker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.addCleanup(attacker.close)
        attacker.settimeout(1.0)
        for datagram in self.forged():
            for peer in ports:
                attacker.sendto(datagram, ("127.0.0.1", peer))
        with self.assertRaises(socket.timeout):
            attacker.recvfrom(65536)

        # musterd hangs: the agents ask each other, and the attacker says,
        # again and again, that a newer round started.
        asked = "1 node(s) of round 0 asked, 1 answered"
        musterd.send_signal(signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                for peer in ports:
                    attacker.sendto(self.forged()[-1], ("127.0.0.1", peer))
                time.sleep(0.05)
                # Each has asked, and been answered, twice.
                if all(self.read(f"n{n}.err").count(asked) >= 2 for n in range(2)):
                    break
        finally:
            musterd.send_signal(signal.SIGCONT)
        for n in range(2):
            err = self.read(f"n{n}.err")
            self.assertGreaterEqual(err.count(asked), 2, err)
            # What the attacker sent was read, and dropped.
            self.assertRegex(err, r"; [1-9]\d* datagram\(s\) dropped so far")
            self.assertNotIn("stopping this node's workers", err)
        open(os.path.join(outdir, "go"), "w").close()
        for n, agent in enumerate(agents):
            code, err = self.finish(agent, f"n{n}")
            self.assertEqual(code, 0, err)
        self.assertEqual(sorted(self.records(outdir)), [(0, 0), (1, 0)])


class NoCredential(AttackTest):
    """5: with no credential anyone may join, but nothing they send makes the
    rendezvous grow without bound or lie to the real agents."""

    def test_ten_thousand_junk_jobs_are_gone_once_their_join_timeout_passes(self):
        proc, port = self.start_musterd("--max-join-timeout", "2s")
        for wave in ("junk", "wave2"):
            counts, messages = self.flood(port, "--jobs", "10000", "--prefix", wave,
                                          "--min-nodes", "2", "--connections", "50",
                                          "--per-connection", "16",
                                          "--timeout", "0.5", "--join-timeout-ms", "600000",
                                          "--expect", "4")
            # Each join waited, then gave up (DEADLINE_EXCEEDED); on a slow machine (a
            # sanitizer build) a few find their connection's places still held, and
            # are refused (RESOURCE_EXHAUSTED) before they make a job.
            self.assertLessEqual(set(counts), {4, 8}, messages)
            self.assertGreater(counts.get(4, 0), 5000, (counts, messages))
            for i in (0, 5000, 9999):
                self.assertTrue(
                    wait_for(lambda: self.call(port, "Status", {"jobId": f"{wave}-{i}"})[0] ==
                             "NOT_FOUND", 30), f"{wave}-{i} is still there after 30 s")
        # A real job runs afterwards.
        outdir = self.path("out")
        agents = [self.worker_agent(f"n{n}", port, outdir, max_restarts="0") for n in range(2)]
        self.assertTrue(wait_for(lambda: len(self.records(outdir)) == 2, 30), self.read("n0.err"))
        open(os.path.join(outdir, "go"), "w").close()
        for n, agent in enumerate(agents):
            self.assertEqual(self.finish(agent, f"n{n}")[0], 0)
        self.assertLess(self.read("musterd.err").count("forgotten: no node in it"), 1000,
                        "one log line per forgotten job")

    def test_a_huge_host_is_refused_naming_the_field_and_the_bound(self):
        _, port = self.start_musterd()
        counts, messages = self.flood(port, "--jobs", "1", "--host-bytes", str(3_879_731),
                                      "--expect", "3")
        self.assertEqual(counts, {3: 1}, messages)  # INVALID_ARGUMENT
        self.assertIn("host is 3879731 bytes long", messages[3])
        self.assertIn("at most 255", messages[3])
        self.assertLess(os.path.getsize(self.path("musterd.err")), 64 << 10,
                        "the host was logged whole")

    def test_a_200_kib_traceback_reaches_every_agent_cut_with_the_root_cause_intact(self):
        _, port = self.start_musterd()
        outdir = self.path("out")
        os.makedirs(outdir)
        worker = os.path.join(outdir, "fail.py")
        with open(worker, "w") as f:
            f.write(
                "import json, os, sys, time\n"
                "if os.environ['RANK'] == '1':\n"
                "    big = 'RuntimeError: root-cause-marker ' + 'x' * (200 << 10) + ' tail-marker'\n"
                "    with open(os.environ['TORCHELASTIC_ERROR_FILE'], 'w') as f:\n"
                "        json.dump({'message': {'message': big, 'extraInfo': {\n"
                "            'py_callstack': 'Traceback ...', 'timestamp': str(int(time.time()))}}}, f)\n"
                "    sys.exit(1)\n"
                "time.sleep(60)\n")
        agents = [self.spawn(f"n{n}", [
            MUSTER, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", JOB, "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "0",
            "--rdzv-conf", "is_host=0", "/usr/bin/python3", worker]) for n in range(2)]
        errors = []
        for n, agent in enumerate(agents):
            code, err = self.finish(agent, f"n{n}")
            self.assertEqual(code, 1, err)
            errors.append(err)
        for err in errors:
            self.assertNotIn("did not answer", err, "a closing event too big to receive")
            self.assertIn("root-cause-marker", err)
        # The node that failed shows its worker's whole message; the other got
        # it from the rendezvous, cut at 64 KiB with a mark, rank and exit intact.
        local = [e for e in errors if "tail-marker" in e]
        remote = [e for e in errors if "tail-marker" not in e]
        self.assertEqual(len(local), 1, errors)
        self.assertEqual(len(remote), 1, errors)
        self.assertIn("Root cause on another node: rank 1", remote[0])
        self.assertIn("(exit code 1)", remote[0])
        self.assertIn("[cut: ", remote[0])


if __name__ == "__main__":
    unittest.main()
