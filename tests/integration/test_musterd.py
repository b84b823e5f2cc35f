"""musterd, the standalone rendezvous daemon, driven by real muster agents on
loopback: issue 3's "Must work" 6 (jobs kept apart) and 7 (bad input), and
the daemon's own basics (start line, port in use, SIGTERM, --help)."""
import glob
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import time
import unittest

from harness import (MUSTER, RDZV_CALL, ROOT, TempDirTest, env, read_env, reserve_port, run,
                     wait_for)

MUSTERD = os.environ.get("MUSTERD", os.path.join(ROOT, "build", "rendezvous", "musterd"))
SERVING = re.compile(r"musterd: serving rendezvous on (\S+):(\d+)$", re.M)
# The longest single argument or environment string Linux passes to a program
# (MAX_ARG_STRLEN, 128 KiB with its NUL): a 1 MB --rdzv-id cannot reach muster.
MAX_ARG_STRLEN = 131072



class MusterdTest(TempDirTest):
    """Starts musterd and muster agents in the background; cleanup kills what is left."""

    def start_musterd(self, *args, name="musterd"):
        """Starts musterd on a free loopback port; returns (process, port) once it serves."""
        proc = self.spawn(name, [MUSTERD, "--listen", "127.0.0.1", "--port", "0", *args])
        wait_for(lambda: SERVING.search(self.read(f"{name}.out")) or proc.poll() is not None,
                 timeout=15)
        match = SERVING.search(self.read(f"{name}.out"))
        self.assertTrue(match, f"musterd did not start: {self.read(f'{name}.err')}")
        self.assertEqual(match.group(1), "127.0.0.1")
        return proc, int(match.group(2))

    def call(self, port, method, request, *credential, timeout=3):
        """rdzv-call's (status name, message, JSON lines printed before it)."""
        result = run([RDZV_CALL, "--target", f"127.0.0.1:{port}", "--timeout", str(timeout),
                      *credential, method, json.dumps(request)], timeout=timeout + 20)
        lines = result.stdout.splitlines()
        self.assertTrue(lines, f"rdzv-call printed nothing: {result.stderr}")
        code, _, message = lines[-1].partition("\t")
        self.assertEqual(result.returncode, 0 if code == "OK" else 1, result.stdout + result.stderr)
        return code, message, [json.loads(line) for line in lines[:-1]]

    def start_agent(self, name, port, job, nnodes, outdir, *extra, nproc=1, **extra_env):
        """A muster agent of `job` whose workers write their environment to outdir/env.$RANK."""
        os.makedirs(outdir, exist_ok=True)
        return self.spawn(name, [
            MUSTER, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", job, "--nnodes", nnodes, "--nproc-per-node", str(nproc), *extra,
            "--no-python", "sh", "-c", f"env > {outdir}/env.$RANK"], **extra_env)

    def spawn(self, name, argv, **extra_env):
        out = open(self.path(f"{name}.out"), "w")
        err = open(self.path(f"{name}.err"), "w")
        proc = subprocess.Popen(argv, env=env(**extra_env), stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.addCleanup(self._reap, proc, out, err)
        return proc

    def finish(self, proc, name, timeout=60):
        """Waits for proc; returns (exit code, its stderr)."""
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.fail(f"{name} still running after {timeout} s: {self.read(f'{name}.err')}")
        return code, self.read(f"{name}.err")

    def run_job(self, port, job, nodes=2):
        """Runs a whole job of `nodes` agents against musterd; returns the ranks' environments."""
        outdir = self.path(f"out-{job}")
        agents = [self.start_agent(f"{job}-{n}", port, job, str(nodes), outdir,
                                   "--rdzv-conf", "is_host=0") for n in range(nodes)]
        for n, agent in enumerate(agents):
            code, err = self.finish(agent, f"{job}-{n}")
            self.assertEqual(code, 0, err)
        return {int(read_env(p)["RANK"]): read_env(p) for p in glob.glob(f"{outdir}/env.*")}

    def assert_serving(self, musterd, port, job):
        self.assertIsNone(musterd.poll(), "musterd died: " + self.read("musterd.err"))
        envs = self.run_job(port, job)
        self.assertEqual(sorted(envs), [0, 1])


class Jobs(MusterdTest):
    """6: jobs with different ids on one musterd do not see each other."""

    def test_two_jobs_at_once_are_kept_apart(self):
        musterd, port = self.start_musterd()
        jobs = {"job-a": self.path("a"), "job-b": self.path("b")}
        # One node of each: were the jobs merged, these two would form a round of two.
        first = {job: self.start_agent(f"{job}-0", port, job, "2", d, nproc=2)
                 for job, d in jobs.items()}
        time.sleep(1.5)
        for job, d in jobs.items():
            self.assertEqual(glob.glob(f"{d}/env.*"), [],
                             f"{job} started with a node of the other job")
            self.assertIsNone(first[job].poll(), self.read(f"{job}-0.err"))
        second = {job: self.start_agent(f"{job}-1", port, job, "2", d, nproc=2)
                  for job, d in jobs.items()}
        for job in jobs:
            for n, agent in enumerate([first[job], second[job]]):
                code, err = self.finish(agent, f"{job}-{n}")
                self.assertEqual(code, 0, err)
        masters = {}
        for job, d in jobs.items():
            envs = [read_env(p) for p in glob.glob(f"{d}/env.*")]
            self.assertEqual(sorted(int(e["RANK"]) for e in envs), [0, 1, 2, 3], job)
            self.assertEqual({e["WORLD_SIZE"] for e in envs}, {"4"}, job)
            self.assertEqual({e["TORCHELASTIC_RUN_ID"] for e in envs}, {job})
            master = {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}
            self.assertEqual(len(master), 1, f"{job}: ranks disagree on the master: {master}")
            masters[job] = master.pop()
        self.assertNotEqual(masters["job-a"][1], masters["job-b"][1],
                            "two jobs on one host were given the same MASTER_PORT")
        # musterd, not an agent, served both, and logged each round.
        log = self.read("musterd.err")
        for job in jobs:
            self.assertRegex(log, rf"job '{job}' round 0: 2 nodes, world size 4")
        self.assertIsNone(musterd.poll())

    def test_node_with_other_nnodes_is_refused_and_the_job_goes_on(self):
        musterd, port = self.start_musterd()
        outdir = self.path("a")
        a0 = self.start_agent("a0", port, "job-a", "2", outdir, "--rdzv-conf", "is_host=0")
        self.assertTrue(wait_for(lambda: "job 'job-a' created" in self.read("musterd.err"), 15),
                        self.read("a0.err"))
        intruder = self.start_agent("bad", port, "job-a", "1:3", self.path("bad"),
                                    "--rdzv-conf", "is_host=0")
        code, err = self.finish(intruder, "bad", timeout=20)
        self.assertNotEqual(code, 0, err)
        self.assertIn("job 'job-a' runs with --nnodes 2:2", err)
        self.assertIn("asked for --nnodes 1:3", err)
        self.assertEqual(glob.glob(self.path("bad/env.*")), [], "the refused node ran workers")
        a1 = self.start_agent("a1", port, "job-a", "2", outdir, "--rdzv-conf", "is_host=0")
        for name, agent in [("a0", a0), ("a1", a1)]:
            code, err = self.finish(agent, name)
            self.assertEqual(code, 0, err)
        ranks = sorted(int(read_env(p)["RANK"]) for p in glob.glob(f"{outdir}/env.*"))
        self.assertEqual(ranks, [0, 1])
        self.assertIsNone(musterd.poll())


class BadInput(MusterdTest):
    """7: bad ids, garbage on the port, an endpoint nobody answers: clear errors, and
    musterd keeps serving the others."""

    def muster_once(self, port, job, conf="is_host=0", timeout=30, **extra_env):
        args = [MUSTER, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                "--rdzv-conf", conf, "--nnodes", "1", "--nproc-per-node", "1"]
        if job is not None:
            args += ["--rdzv-id", job]
        started = time.monotonic()
        result = run(args + ["--no-python", "true"], timeout=timeout, **extra_env)
        return result, time.monotonic() - started

    def test_rdzv_id_with_spaces(self):
        musterd, port = self.start_musterd()
        result, _ = self.muster_once(port, "my job")
        # The launcher checks the id before anything starts: a usage error.
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("--rdzv-id", result.stderr)
        self.assertIn("space", result.stderr)
        self.assert_serving(musterd, port, "after-spaces")

    def test_rdzv_id_too_long_for_a_command_line_is_refused_clearly(self):
        # 1 MB cannot be passed (see MAX_ARG_STRLEN): the longest id that can, by argv and
        # by PET_RDZV_ID, gets a short, clear error; 1 MB goes to musterd in the test below.
        musterd, port = self.start_musterd()
        for how in ("argv", "env"):
            with self.subTest(how=how):
                if how == "argv":
                    result, _ = self.muster_once(port, "x" * (MAX_ARG_STRLEN - 1))
                else:
                    value = "x" * (MAX_ARG_STRLEN - 1 - len("PET_RDZV_ID="))
                    result, _ = self.muster_once(port, None, PET_RDZV_ID=value)
                self.assertEqual(result.returncode, 2, result.stderr[:500])
                self.assertIn("--rdzv-id", result.stderr[:2000])
                self.assertLess(len(result.stderr), 4096, "the error repeats the whole id")
        self.assert_serving(musterd, port, "after-long")

    def test_rdzv_id_of_one_megabyte_is_refused_by_musterd(self):
        musterd, port = self.start_musterd()
        # JoinRequest.job_id, and protocol_version 2 (field 5, a varint;
        # rendezvous/rules/protocol.h)
        join = proto_string(1, "j" * (1 << 20)) + varint(5 << 3) + varint(2)
        status, message = grpc_unary(port, "/muster.rdzv.Rendezvous/Join", join)
        self.assertEqual(status, 3, message)  # INVALID_ARGUMENT
        self.assertIn("job id (--rdzv-id) is 1048576 characters long", message)
        self.assertLess(os.path.getsize(self.path("musterd.err")), 4096,
                        "musterd logged the whole id")
        self.assert_serving(musterd, port, "after-megabyte")

    def test_garbage_on_the_port(self):
        musterd, port = self.start_musterd()
        rng = random.Random(3)
        payloads = [
            bytes(rng.randrange(256) for _ in range(4096)),
            b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
            b"POST /muster.rdzv.Rendezvous/Join HTTP/1.1\r\nContent-Length: 100000\r\n\r\nabc",
            H2_PREFACE + bytes(rng.randrange(256) for _ in range(4096)),
        ]
        for payload in payloads:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                try:
                    s.sendall(payload)
                    s.recv(4096)
                except OSError:
                    pass  # the server may close on us: that is fine
        # A well-formed call whose message is not a JoinRequest.
        status, message = grpc_unary(port, "/muster.rdzv.Rendezvous/Join", b"\xff" * 64)
        self.assertNotEqual(status, 0, message)
        # A connection left open and silent does not block anyone.
        idle = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.addCleanup(idle.close)
        self.assert_serving(musterd, port, "after-garbage")

    def test_endpoint_that_never_answers(self):
        port = reserve_port()  # nobody listens there
        result, elapsed = self.muster_once(port, "lonely", "is_host=0,join_timeout=2",
                                           timeout=60)
        self.assertNotEqual(result.returncode, 0, result.stderr)
        self.assertLess(elapsed, 10, result.stderr)
        self.assertIn(f"no rendezvous answered at 127.0.0.1:{port} within join_timeout",
                      result.stderr)


class Daemon(MusterdTest):
    """musterd itself: start line, --help, port in use, SIGTERM."""

    def test_help_and_version(self):
        result = run([MUSTERD, "--help"], timeout=10)
        self.assertEqual(result.returncode, 0, result.stderr)
        for text in ("--listen", "--port", "29400", "--max-join-timeout", "--max-jobs",
                     "--ping-interval", "--ping-timeout", "Exit status"):
            self.assertIn(text, result.stdout)
        result = run([MUSTERD, "--version"], timeout=10)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertRegex(result.stdout, r"^musterd \d+\.\d+")

    def test_bad_flags_exit_2_with_one_line(self):
        for args in (["--port", "70000"], ["--bogus"], ["--listen", "127.0.0.1:5"], ["extra"],
                     ["--max-jobs", "0"], ["--max-join-timeout", "soon"],
                     ["--max-join-timeout", "0"], ["--ping-interval", "0"],
                     ["--ping-timeout", "soon"]):
            with self.subTest(args=args):
                result = run([MUSTERD, *args], timeout=10)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertRegex(result.stderr, r"^musterd: error: .+\n$")

    def test_port_in_use(self):
        _, port = self.start_musterd()
        result = run([MUSTERD, "--listen", "127.0.0.1", "--port", str(port)], timeout=20)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn(f"port {port} is in use", result.stderr)
        self.assertIn("--port", result.stderr)
        # One line of ours, none of gRPC's.
        self.assertEqual(len(result.stderr.splitlines()), 1, result.stderr)

    def test_port_taken_by_an_agent_hosting_a_rendezvous(self):
        port = reserve_port()
        host = self.start_agent("host", port, "hosted", "2", self.path("h"),
                                "--rdzv-conf", "is_host=1")
        listening = lambda: f"on port {port}" in self.read("host.err") or host.poll() is not None
        self.assertTrue(wait_for(listening, 15) and host.poll() is None, self.read("host.err"))
        result = run([MUSTERD, "--listen", "127.0.0.1", "--port", str(port)], timeout=20)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn(f"port {port} is in use", result.stderr)

    def test_sigterm_exits_0_and_pending_agents_fail_clearly(self):
        musterd, port = self.start_musterd("--event-log", self.path("events"))
        pending = [self.start_agent(f"p{n}", port, "never-full", "3", self.path("p"),
                                    "--rdzv-conf", "is_host=0") for n in range(2)]

        def both_joined():  # whole lines only: the log is written in batches
            lines = self.read("events").split("\n")[:-1]
            return [json.loads(line)["kind"] for line in lines].count("node_joined") == 2

        self.assertTrue(wait_for(both_joined, 15), self.read("musterd.err"))
        started = time.monotonic()
        musterd.send_signal(signal.SIGTERM)
        code, log = self.finish(musterd, "musterd", timeout=10)
        self.assertEqual(code, 0, log)
        self.assertLess(time.monotonic() - started, 5)
        self.assertIn("SIGTERM", log)
        for n, agent in enumerate(pending):
            code, err = self.finish(agent, f"p{n}", timeout=15)
            self.assertNotEqual(code, 0, err)
            self.assertIn(f"127.0.0.1:{port}", err)
            self.assertIn("shutting down", err)
        self.assertFalse(glob.glob(self.path("p/env.*")))

    def test_sigint_exits_0(self):
        musterd, _ = self.start_musterd()
        musterd.send_signal(signal.SIGINT)
        code, log = self.finish(musterd, "musterd", timeout=10)
        self.assertEqual(code, 0, log)

    def test_ipv6_loopback(self):
        if not socket.has_ipv6:
            self.skipTest("no IPv6 on this host")
        try:
            with socket.socket(socket.AF_INET6) as s:
                s.bind(("::1", 0))
        except OSError as e:
            self.skipTest(f"cannot bind ::1: {e}")
        proc = self.spawn("musterd6", [MUSTERD, "--listen", "::1", "--port", "0"])
        match = wait_for(lambda: re.search(r"serving rendezvous on \[::1\]:(\d+)",
                                           self.read("musterd6.out")), 15)
        self.assertTrue(match, self.read("musterd6.err"))
        port = match.group(1)
        outdir = self.path("v6")
        os.makedirs(outdir)
        agents = [self.spawn(f"v6-{n}", [
            MUSTER, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"[::1]:{port}", "--rdzv-id",
            "v6", "--rdzv-conf", "is_host=0", "--nnodes", "2", "--nproc-per-node", "1",
            "--no-python", "sh", "-c", f"env > {outdir}/env.$RANK"]) for n in range(2)]
        for n, agent in enumerate(agents):
            code, err = self.finish(agent, f"v6-{n}")
            self.assertEqual(code, 0, err)
        self.assertEqual(sorted(os.listdir(outdir)), ["env.0", "env.1"])
        self.assertIsNone(proc.poll())


# --- A minimal HTTP/2 gRPC client: enough to send what muster never would. ---

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4


def varint(n):
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def proto_string(field, text):
    data = text.encode()
    return varint(field << 3 | 2) + varint(len(data)) + data


def hpack_int(value, prefix_bits, first=0):
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out, value = bytearray([first | limit]), value - limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def hpack_literal(name, value):
    """A header as a literal without indexing, no Huffman coding."""
    n, v = name.encode(), value.encode()
    return b"\x00" + hpack_int(len(n), 7) + n + hpack_int(len(v), 7) + v


def frame(kind, flags, stream, payload=b""):
    head = struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream)
    return head + payload


def read_frame(sock):
    def exactly(n):
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data
    head = exactly(9)
    length = int.from_bytes(head[:3], "big")
    return head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF, exactly(length)


def grpc_unary(port, path, message, timeout=20):
    """Sends one gRPC request on stream 1 and returns (grpc-status, grpc-message) read
    from the server's trailers. Honours flow control, so megabytes can be sent. Relies
    on gRPC writing those two headers as plain (not Huffman-coded) literals, as it does."""
    body = b"\x00" + struct.pack(">I", len(message)) + message
    headers = b"".join(hpack_literal(k, v) for k, v in [
        (":method", "POST"), (":scheme", "http"), (":path", path),
        (":authority", f"127.0.0.1:{port}"), ("content-type", "application/grpc"),
        ("te", "trailers")])
    deadline = time.monotonic() + timeout
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(H2_PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 1, headers))
        conn_window = stream_window = 65535
        max_frame = 16384
        sent, received = 0, b""
        while time.monotonic() < deadline:
            while sent < len(body) and min(conn_window, stream_window) > 0:
                n = min(conn_window, stream_window, max_frame, len(body) - sent)
                last = sent + n == len(body)
                sock.sendall(frame(DATA, END_STREAM if last else 0, 1, body[sent:sent + n]))
                sent += n
                conn_window -= n
                stream_window -= n
            kind, flags, stream, payload = read_frame(sock)
            if kind == SETTINGS and not flags & ACK:
                for i in range(0, len(payload), 6):
                    key, value = struct.unpack(">HI", payload[i:i + 6])
                    if key == 4:  # INITIAL_WINDOW_SIZE
                        stream_window += value - 65535
                    elif key == 5:  # MAX_FRAME_SIZE
                        max_frame = value
                sock.sendall(frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK:
                sock.sendall(frame(PING, ACK, 0, payload))
            elif kind == WINDOW_UPDATE:
                increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
                if stream == 0:
                    conn_window += increment
                else:
                    stream_window += increment
            elif kind == HEADERS and stream == 1:
                received += payload
                if flags & END_STREAM:
                    return parse_trailers(received)
            elif kind == RST_STREAM and stream == 1:
                return -1, f"stream reset, code {int.from_bytes(payload, 'big')}"
            elif kind == GOAWAY:
                return -1, f"GOAWAY {payload!r}"
        raise TimeoutError("no answer from the server")


def parse_trailers(block):
    def value_after(name):
        at = block.find(name)
        if at < 0:
            return None
        i = at + len(name)
        length = block[i] & 0x7F
        i += 1
        if length == 0x7F:  # a multi-byte HPACK integer
            shift = 0
            while True:
                byte = block[i]
                i += 1
                length += (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
        return block[i:i + length].decode(errors="replace")
    status = value_after(b"grpc-status")
    return (int(status) if status and status.isdigit() else -1), value_after(b"grpc-message") or ""


if __name__ == "__main__":
    unittest.main()
