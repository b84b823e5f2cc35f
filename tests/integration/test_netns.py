"""Several hosts with their own addresses: one network namespace per host,
joined by veth pairs to a bridge in a "switch" namespace. The test makes and
removes all of it; nothing touches the machine's own network, and every
address lives only inside these namespaces. Needs root (CI runs as root)."""
import glob
import json
import os
import shutil
import signal
import subprocess
import time
import unittest

from certificates import make_certificates, openssl_missing
from harness import (MUSTER, MUSTERD, RDZV_CALL, WORKERS, TempDirTest, env, wait_for,
                     worker_records)

RECORD = os.path.join(WORKERS, "record.py")
CLUSTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "etcd", "cluster.sh")
HOSTS = 3
SUBNET = "10.77.0"
PORT = 29400


def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


class Topology:
    def __init__(self, hosts=HOSTS):
        tag = f"mu{os.getpid() % 100000}"
        self.switch = f"{tag}sw"
        self.hosts = [f"{tag}h{i}" for i in range(hosts)]

    def address(self, i):
        return f"{SUBNET}.{i + 1}"

    def create(self):
        ip("netns", "add", self.switch)
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")
        for i, host in enumerate(self.hosts):
            ip("netns", "add", host)
            ip("-n", host, "link", "set", "lo", "up")
            ip("-n", self.switch, "link", "add", f"e{i}", "type", "veth", "peer", "name", "eth0",
               "netns", host)
            ip("-n", self.switch, "link", "set", f"e{i}", "master", "br0", "up")
            ip("-n", host, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            ip("-n", host, "link", "set", "eth0", "up")

    def destroy(self):
        for name in [self.switch, *self.hosts]:
            ip("netns", "del", name, check=False)

    def cut(self, i):
        """Pulls host i's cable: its switch port goes down."""
        ip("-n", self.switch, "link", "set", f"e{i}", "down")

    def mend(self):
        for i in range(len(self.hosts)):
            ip("-n", self.switch, "link", "set", f"e{i}", "up")


def namespaces_usable():
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    probe = f"muprobe{os.getpid()}"
    result = ip("netns", "add", probe, check=False)
    if result.returncode != 0:
        return f"cannot create a network namespace: {result.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


SKIP_REASON = namespaces_usable()


class HostsTest(TempDirTest):
    """Builds the hosts once per class; its agents are muster on those hosts."""

    HOSTS = HOSTS

    @classmethod
    def setUpClass(cls):
        cls.net = Topology(cls.HOSTS)
        try:
            cls.net.create()
        except subprocess.CalledProcessError as e:
            cls.net.destroy()
            raise unittest.SkipTest(f"cannot build the test network: {e.stderr.strip()}")

    @classmethod
    def tearDownClass(cls):
        cls.net.destroy()


    def setUp(self):
        super().setUp()
        self.net.mend()
        self.addCleanup(self.net.mend)

    # Given to every c10d agent: "ha=0" where the rendezvous must live in
    # host 0's agent alone; "" for the default (ha where etcd is installed).
    HA = ""

    def agent(self, i, *args, nnodes="3", conf="", program=None, own_shm=False,
              backend="c10d", endpoint=None):
        """Host i's agent running RECORD with args, or `program` (a list) instead.
        own_shm: the host gets its own /dev/shm, as a container has. The
        rendezvous is host 0's (c10d), unless backend and endpoint say."""
        rdzv_conf = "last_call_timeout=1,keep_alive_interval=0.5,heartbeat_timeout=3"
        for extra in (self.HA if backend == "c10d" else "", conf):
            if extra:
                rdzv_conf += "," + extra
        out = open(self.path(f"n{i}.out"), "w")
        err = open(self.path(f"n{i}.err"), "w")
        if program is None:
            program = ["--no-python", "/usr/bin/python3", RECORD, self.tmp, *args]
        # `ip netns exec` runs in a mount namespace of its own: a mount there stays there.
        shm = ["sh", "-c", 'mount -t tmpfs tmpfs /dev/shm && exec "$@"', "sh"] if own_shm else []
        command = ["ip", "netns", "exec", self.net.hosts[i], *shm, MUSTER, "--nnodes", nnodes,
                   "--nproc-per-node", "2", "--rdzv-backend", backend, "--rdzv-endpoint",
                   endpoint or f"{self.net.address(0)}:{PORT}", "--rdzv-id", "netjob", "--rdzv-conf",
                   rdzv_conf, "--node-rank", str(i), *program]
        proc = subprocess.Popen(command, env=env(), stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.addCleanup(self._reap, proc, out, err)
        return proc

    def records(self):
        return worker_records(self.tmp)

    def errors(self, indices):
        return "\n".join(f"--- n{i}\n{self.read(f'n{i}.err')}" for i in indices)


@unittest.skipIf(SKIP_REASON, SKIP_REASON or "")
class SeveralHosts(HostsTest):
    """Host mode as ever (ha=0): the rendezvous in host 0's agent."""

    HA = "ha=0"

    def test_three_hosts_form_one_job_with_host_0_as_master(self):
        procs = [self.agent(i) for i in range(HOSTS)]
        codes = [p.wait(timeout=60) for p in procs]
        self.assertEqual(codes, [0, 0, 0], self.errors(range(HOSTS)))
        records = self.records()
        self.assertEqual(sorted(r[2] for r in records), [0, 1, 2, 3, 4, 5])
        self.assertEqual({r[3]["MASTER_ADDR"] for r in records}, {self.net.address(0)})
        self.assertEqual(len({r[3]["MASTER_PORT"] for r in records}), 1)
        for _, _, rank, e in records:
            self.assertEqual(e["GROUP_RANK"], str(rank // 2))
        self.assertIn("hosting the rendezvous", self.read("n0.err"))

    def test_allreduce_between_hosts_takes_the_tcp_ring(self):
        # Each host has its own /dev/shm, as containers on one machine do:
        # shared memory cannot join them, so `auto` picks the ring, over the veths.
        procs = [self.agent(i, own_shm=True, program=["muster-allreduce", "-b", "8", "-e", "1M",
                                                       "-f", "8", "-n", "3", "-w", "1"])
                 for i in range(HOSTS)]
        codes = [p.wait(timeout=90) for p in procs]
        self.assertEqual(codes, [0, 0, 0], self.errors(range(HOSTS)))
        table = self.read("n0.out")
        self.assertIn("6 ranks, backend tcp", table)
        self.assertIn("# Wrong values         : 0 OK", table)
        for size in (8, 64, 512, 4096, 32768, 262144):
            self.assertRegex(table, rf"\[rank 0\]:\s+{size}\s")

    def test_cut_link_is_a_dead_node_and_the_rest_go_on(self):
        procs = [self.agent(i, "--seconds", "20", nnodes="2:3") for i in range(HOSTS)]
        started = wait_for(lambda: len([r for r in self.records() if r[1] == 6]) == 6, timeout=30)
        self.assertTrue(started, self.errors(range(HOSTS)))
        self.net.cut(2)
        cut_at = time.monotonic()
        reformed = wait_for(lambda: len([r for r in self.records() if r[1] == 4]) == 4, timeout=30)
        self.assertTrue(reformed, self.errors(range(HOSTS)))
        # The server's kernel gives the silent connection up within 4 s (TCP
        # keepalive: 1 s idle, 3 probes a second apart), which ends the node's
        # watch stream; its heartbeat_timeout (3 s) runs from there.
        self.assertLess(time.monotonic() - cut_at, 4 + 3 + 1 + 1.5)
        four = [r for r in self.records() if r[1] == 4]
        self.assertEqual(sorted(r[2] for r in four), [0, 1, 2, 3])
        self.assertEqual({r[3]["MASTER_ADDR"] for r in four}, {self.net.address(0)})
        # The cut-off host cannot reach the rendezvous: it gives up on its own.
        self.assertEqual(procs[2].wait(timeout=30), 1, self.errors([2]))
        self.assertIn("did not answer", self.read("n2.err"))
        for p in procs[:2]:
            p.send_signal(signal.SIGTERM)
        self.assertEqual([p.wait(timeout=30) for p in procs[:2]], [143, 143])

    def test_sigkill_one_host_the_others_reform(self):
        procs = [self.agent(i, "--seconds", "20", nnodes="2:3") for i in range(HOSTS)]
        started = wait_for(lambda: len([r for r in self.records() if r[1] == 6]) == 6, timeout=30)
        self.assertTrue(started, self.errors(range(HOSTS)))
        # `ip netns exec` execs muster, so the pid is the agent's.
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait(timeout=10)
        reformed = wait_for(lambda: len([r for r in self.records() if r[1] == 4]) == 4, timeout=30)
        self.assertTrue(reformed, self.errors([0, 2]))
        for p in (procs[0], procs[2]):
            p.send_signal(signal.SIGTERM)
        self.assertEqual([procs[0].wait(timeout=30), procs[2].wait(timeout=30)], [143, 143])


@unittest.skipIf(SKIP_REASON, SKIP_REASON or "")
class PartitionFromMusterd(HostsTest):
    """musterd on host 0, an agent on each host. A host whose link is cut
    cannot reach musterd nor the other nodes of its round: it stops its
    workers at once, before musterd drops it and seats the others in a new
    round, so no two rounds run at once (docs/multi-node.md)."""

    def start_musterd(self):
        out = open(self.path("musterd.out"), "w")
        err = open(self.path("musterd.err"), "w")
        proc = subprocess.Popen(["ip", "netns", "exec", self.net.hosts[0], MUSTERD, "--listen",
                                 self.net.address(0), "--port", str(PORT)], env=env(), stdout=out,
                                stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        self.addCleanup(self._reap, proc, out, err)
        self.assertTrue(wait_for(lambda: "serving" in self.read("musterd.out") or
                                 proc.poll() is not None, timeout=15), self.read("musterd.err"))
        return proc

    def started(self, world):
        """When each worker of a world of `world` ranks started: (restart, rank) -> time."""
        return {(r[0], r[2]): os.path.getmtime(glob.glob(self.path(f"env.{r[0]}.{world}.{r[2]}.*"))[0])
                for r in self.records() if r[1] == world}

    def stopped(self, restart, world):
        """When the workers of that round stopped on SIGTERM: rank -> time."""
        out = {}
        for path in glob.glob(self.path(f"stop.{restart}.{world}.*")):
            out[int(os.path.basename(path).split(".")[3])] = float(self.read(os.path.basename(path)))
        return out

    def start_rendezvous(self):
        self.start_musterd()
        return {"conf": "is_host=0,heartbeat_timeout=6"}

    def test_a_host_cut_off_alone_stops_its_round_before_a_new_one_starts(self):
        rendezvous = self.start_rendezvous()
        # The cut host finds the rendezvous silent within 2 x keep_alive_interval
        # and its peers in 1 s more; musterd drops it heartbeat_timeout (6 s)
        # after it last heard of it. With the defaults (5 s, 30 s) the gap is wider.
        procs = [self.agent(i, "--seconds", "15", "--record-stop", nnodes="2:3", **rendezvous)
                 for i in range(HOSTS)]
        self.assertTrue(wait_for(lambda: len(self.started(6)) == 6, timeout=30),
                        self.errors(range(HOSTS)))
        self.net.cut(2)
        cut_at = time.time()
        self.assertTrue(wait_for(lambda: len(self.started(4)) == 4, timeout=30),
                        self.errors(range(HOSTS)) + self.server_log())
        new_round_at = min(self.started(4).values())
        # Ranks 4 and 5 are host 2's.
        self.assertTrue(wait_for(lambda: {4, 5} <= set(self.stopped(0, 6)), timeout=20),
                        self.errors([2]))
        err = self.read("n2.err")
        self.assertIn("of its round does not answer either; stopping this node's workers", err)
        stops = self.stopped(0, 6)
        stops = {rank: stops[rank] for rank in (4, 5)}
        # The old round's workers on the cut host were gone before the new round began.
        self.assertLess(max(stops.values()), new_round_at, err)
        print(f"\n  cut -> the cut host's workers stopped {max(stops.values()) - cut_at:.2f} s, "
              f"-> the others' new round {new_round_at - cut_at:.2f} s", flush=True)
        # Back on the network, it rejoins: the job grows to three hosts again.
        self.net.mend()
        self.assertTrue(wait_for(lambda: len([r for r in self.records() if r[1] == 6]) == 12,
                                 timeout=40), self.errors(range(HOSTS)))
        codes = [p.wait(timeout=60) for p in procs]
        self.assertEqual(codes, [0, 0, 0], self.errors(range(HOSTS)))
        # Losing a node spends no restart.
        self.assertEqual({r[0] for r in self.records()}, {0})


    def server_log(self):
        return self.read("musterd.err")


ETCD_SKIP_REASON = SKIP_REASON or (None if shutil.which("etcd") else
                                   "needs etcd (scripts/setup installs etcd-server)")


@unittest.skipIf(ETCD_SKIP_REASON, ETCD_SKIP_REASON or "")
class PartitionFromEtcd(PartitionFromMusterd):
    """The same with --rdzv-backend etcd, a 3-member cluster on host 0. The
    etcd backend's watch outlives an outage (its client opens it again), so
    an agent heartbeats while it watches, and one cut off learns it as with
    musterd: before, it rode the cut out with its old round running."""

    def start_rendezvous(self):
        cluster = self.path("etcd")
        environ = {**env(), "ETCD_CLUSTER_HOST": self.net.address(0),
                   "ETCD_CLUSTER_OWNER_PID": str(os.getpid())}
        netns = ["ip", "netns", "exec", self.net.hosts[0]]
        started = subprocess.run([*netns, CLUSTER, "start", cluster], env=environ,
                                 capture_output=True, text=True, timeout=90)
        self.assertEqual(started.returncode, 0, started.stdout + started.stderr)
        self.addCleanup(subprocess.run, [*netns, CLUSTER, "stop", cluster], env=environ,
                        capture_output=True, timeout=60)
        self.cluster = cluster
        # The cut host's heartbeat (a read of its outbox) fails within the
        # etcd client's 5 s call timeout, where musterd's keepalive finds the
        # cut in 3 s: its lease (heartbeat_timeout) is longer here to match.
        return {"conf": "heartbeat_timeout=10", "backend": "etcd",
                "endpoint": self.read("etcd/endpoints").strip()}

    def server_log(self):
        return "\n".join(self.read(f"etcd/m{n}.log")[-2000:] for n in range(3))


@unittest.skipIf(ETCD_SKIP_REASON, ETCD_SKIP_REASON or "")
class OwnEtcd(HostsTest):
    """Host mode by default, where etcd is installed (ha): the job's
    rendezvous on an etcd cluster of its own nodes (a member on host 0 at
    the endpoint, two more added from the nodes that join), so the job
    outlives the node that hosts it."""

    HOSTS = 4

    def seated(self, indices):
        """Whether the etcd members of the hosts `indices` have started."""
        return all("the job's etcd member" in self.read(f"n{i}.err") and
                   "started (pid" in self.read(f"n{i}.err") for i in indices)

    def started_since(self, since, world):
        """The ranks of a world of `world` started after `since`: rank -> when."""
        out = {}
        for path in glob.glob(self.path(f"env.*.{world}.*")):
            if path.endswith(".tmp"):
                continue  # written aside, then renamed
            when = os.path.getmtime(path)
            if when > since:
                out[int(os.path.basename(path).split(".")[3])] = when
        return out

    def exit_codes(self, procs, indices, timeout):
        """The exit codes of procs[i] for i in `indices`, each within `timeout`."""
        try:
            return [procs[i].wait(timeout=timeout) for i in indices]
        except subprocess.TimeoutExpired as e:
            self.fail(f"{e}\n{self.errors(indices)}")

    def voters(self, indices):
        """How many learners the leaders among `indices` promoted."""
        return sum(self.read(f"n{i}.err").count("is a voter") for i in indices)

    def test_the_job_outlives_the_hosting_node_killed(self):
        procs = [self.agent(i, "--seconds", "25", nnodes="2:3")
                 for i in range(HOSTS)]
        self.assertTrue(wait_for(lambda: len([r for r in self.records() if r[1] == 6]) == 6,
                                 timeout=30), self.errors(range(HOSTS)))
        # Three members before the loss: host 0's and one on each of the others.
        self.assertTrue(wait_for(lambda: self.seated(range(HOSTS)) and
                                 self.voters(range(HOSTS)) >= 2, timeout=30),
                        self.errors(range(HOSTS)))
        # `ip netns exec` execs muster: the pid is the agent's; its etcd dies with it.
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(timeout=10)
        killed_at = time.time()
        self.assertTrue(wait_for(lambda: len(self.started_since(killed_at, 4)) == 4, timeout=30),
                        self.errors([1, 2]))
        again = self.started_since(killed_at, 4)
        print(f"\n  hosting node killed -> the other two training again: "
              f"{max(again.values()) - killed_at:.2f} s", flush=True)
        self.assertEqual(sorted(again), [0, 1, 2, 3])
        self.assertEqual(self.exit_codes(procs, [1, 2], 60), [0, 0], self.errors([1, 2]))
        # Losing a node spends no restart.
        self.assertEqual({r[0] for r in self.records()}, {0})

    def test_a_spare_replaces_the_lost_member_and_the_job_survives_a_second_loss(self):
        # Four hosts for at most three nodes: host 3 waits as a spare.
        procs = [self.agent(i, "--seconds", "30", nnodes="2:3")
                 for i in range(3)]
        self.assertTrue(wait_for(lambda: len([r for r in self.records() if r[1] == 6]) == 6,
                                 timeout=30), self.errors(range(3)))
        procs.append(self.agent(3, "--seconds", "30", nnodes="2:3"))
        self.assertTrue(wait_for(lambda: self.seated(range(3)) and self.voters(range(3)) >= 2,
                                 timeout=30), self.errors(range(3)))
        promoted = self.voters(range(1, 4))
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(timeout=10)
        killed_at = time.time()
        # The spare takes the lost node's seat in the job and its member's in etcd.
        self.assertTrue(wait_for(lambda: len(self.started_since(killed_at, 6)) == 6, timeout=30),
                        self.errors(range(1, 4)))
        self.assertTrue(wait_for(lambda: self.seated([3]) and
                                 self.voters(range(1, 4)) > promoted, timeout=30),
                        self.errors(range(1, 4)))
        # A second member node: host 1. Hosts 2 and 3 hold a majority of the three.
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait(timeout=10)
        killed_at = time.time()
        self.assertTrue(wait_for(lambda: len(self.started_since(killed_at, 4)) == 4, timeout=40),
                        self.errors([2, 3]))
        self.assertEqual(self.exit_codes(procs, [2, 3], 90), [0, 0], self.errors([2, 3]))
        self.assertEqual({r[0] for r in self.records()}, {0})


    def test_the_hosting_node_cut_off_stops_before_the_others_go_on(self):
        # As PartitionFromEtcd: the cut node's heartbeat fails within the etcd
        # client's 5 s, so its lease (heartbeat_timeout) is longer to match.
        conf = "heartbeat_timeout=10"
        procs = [self.agent(i, "--seconds", "20", "--record-stop", nnodes="2:3", conf=conf)
                 for i in range(3)]
        self.assertTrue(wait_for(lambda: len([r for r in self.records() if r[1] == 6]) == 6,
                                 timeout=30), self.errors(range(3)))
        self.assertTrue(wait_for(lambda: self.seated(range(3)) and self.voters(range(3)) >= 2,
                                 timeout=30), self.errors(range(3)))
        self.net.cut(0)
        cut_at = time.time()
        # Hosts 1 and 2 hold two of the three members: they go on without host 0.
        self.assertTrue(wait_for(lambda: len(self.started_since(cut_at, 4)) == 4, timeout=40),
                        self.errors(range(3)))
        new_round_at = min(self.started_since(cut_at, 4).values())
        stops = self.stopped(0, 6)
        # Ranks 0 and 1 are host 0's: gone before the new round began.
        self.assertTrue({0, 1} <= set(stops), self.errors([0]))
        self.assertLess(max(stops[0], stops[1]), new_round_at, self.errors([0]))
        print(f"\n  hosting node cut -> its workers stopped {max(stops[0], stops[1]) - cut_at:.2f} s"
              f", -> the others' new round {new_round_at - cut_at:.2f} s", flush=True)
        # Back on the network, it learns it was dropped and joins again.
        self.net.mend()
        self.assertEqual(self.exit_codes(procs, [0, 1, 2], 90), [0, 0, 0], self.errors(range(3)))
        self.assertRegex(self.read("n0.err"), "lease ended while it was away|was dropped from job")
        self.assertEqual({r[0] for r in self.records()}, {0})

    def stopped(self, restart, world):
        """When the workers of that round stopped on SIGTERM: rank -> time."""
        out = {}
        for path in glob.glob(self.path(f"stop.{restart}.{world}.*")):
            out[int(os.path.basename(path).split(".")[3])] = float(self.read(os.path.basename(path)))
        return out

TLS_SKIP_REASON = SKIP_REASON or openssl_missing()


@unittest.skipIf(TLS_SKIP_REASON, TLS_SKIP_REASON or "")
class TlsAcrossHosts(HostsTest):
    """Host 0 hosts the rendezvous over mutual TLS with a token, host 1 joins it
    over the veths; a plaintext client on host 1 cannot reach it."""

    def rdzv_call(self, i, *args):
        """rdzv-call on host i against host 0's rendezvous: (status name, message, answers)."""
        result = subprocess.run(
            ["ip", "netns", "exec", self.net.hosts[i], RDZV_CALL, "--target",
             f"{self.net.address(0)}:{PORT}", "--timeout", "3", *args], env=env(),
            capture_output=True, text=True, timeout=30)
        lines = result.stdout.splitlines()
        self.assertTrue(lines, f"rdzv-call printed nothing: {result.stderr}")
        code, _, message = lines[-1].partition("\t")
        return code, message, [json.loads(line) for line in lines[:-1]]

    def test_two_hosts_run_a_job_over_tls_and_plaintext_is_refused(self):
        pki = self.path("pki")
        os.makedirs(pki)
        files = make_certificates(pki, [self.net.address(0)])
        token = self.path("token")
        fd = os.open(token, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("0123456789abcdef0123456789abcdef\n")
        ca = f"cacert={files['ca.pem']}"
        confs = [f"token_file={token},{ca},cert={files['server.pem']},key={files['server.key']}",
                 f"token_file={token},{ca},cert={files['client.pem']},key={files['client.key']}"]
        go = self.path("go")
        program = ["--no-python", "sh", "-c",
                   f"touch {self.tmp}/started.$RANK; i=0; while [ ! -e {go} ] && [ $i -lt 600 ]; "
                   f"do sleep 0.1; i=$((i+1)); done; [ -e {go} ]"]
        procs = [self.agent(i, nnodes="2", conf=confs[i], program=program) for i in range(2)]
        started = wait_for(lambda: len(glob.glob(self.path("started.*"))) == 4, timeout=30)
        self.assertTrue(started, self.errors(range(2)))
        self.assertIn(f"on port {PORT} (auth: token, tls)", self.read("n0.err"))
        self.assertIn(f"at {self.net.address(0)}:{PORT} (auth: token, tls)", self.read("n1.err"))

        client = ["--cacert", files["ca.pem"], "--cert", files["client.pem"], "--key",
                  files["client.key"]]
        code, message, answers = self.rdzv_call(1, "--token-file", token, *client, "Status",
                                                '{"jobId": "netjob"}')
        self.assertEqual(code, "OK", message)
        self.assertEqual(answers[0]["participants"], 2)
        code, message, answers = self.rdzv_call(1, "--token-file", token, "Status",
                                                '{"jobId": "netjob"}')
        self.assertEqual(code, "UNAVAILABLE", message)
        self.assertEqual(answers, [])

        open(go, "w").close()
        codes = [p.wait(timeout=60) for p in procs]
        self.assertEqual(codes, [0, 0], self.errors(range(2)))


if __name__ == "__main__":
    unittest.main()
