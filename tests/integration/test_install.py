"""Installing muster like a real tool (issue 15): the .deb that cpack makes
from this build, installed with apt-get on a fresh Debian 12, then used
there as its user would: the four binaries on PATH, the sbatch examples,
musterd's systemd unit naming the installed musterd (and that command run as
the unit runs it), and a real job of the bundled worker on 2 workers.

The fresh machine is a minbase root that scripts/bookworm-root makes once
per machine; each run installs into an overlay of it, so it stays fresh,
entered only through a private mount namespace, so nothing of the host
stays mounted in it. apt-get fetches the dependencies from the root's own
sources (the mirror this host uses: 13 packages, 8 MB). Skipped, with the
reason, where the root is not built or the tests do not run as root.

A build with the NCCL backend loads the CUDA runtime and NCCL from outside
Debian's packages (this machine's image has them in /usr/local/cuda): the
.deb cannot depend on them, so the root gets the directories of every
library the built binaries load from outside /lib and /usr/lib, at the same
paths, as a fresh machine of this kind has them, and nothing else of them."""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

from harness import MUSTER, ROOT, run

BUILD_DIR = os.environ.get("MUSTER_BUILD_DIR",
                           os.path.dirname(os.path.dirname(os.path.abspath(MUSTER))))
BOOKWORM = os.environ.get("MUSTER_BOOKWORM_ROOT", "/var/cache/muster/bookworm")
STAMP = os.path.join(BOOKWORM, ".muster-bookworm")
SBATCH = os.path.join(ROOT, "scripts", "sbatch")

# In a private mount namespace: the overlay of the root (upper layer in the
# test's directory), the directories of the libraries from outside Debian,
# /proc, /dev, this host's name and resolver, the test's directory as /work;
# in a network namespace of its own, its loopback up. Then the command,
# chrooted (or, after --host, run on the host).
_ENTER = r"""set -e
root=$1 layers=$2 work=$3 net=$4 foreign=$5; shift 5
merged=$layers/merged
mount -t overlay overlay -o "lowerdir=$root,upperdir=$layers/upper,workdir=$layers/work" "$merged"
for dir in $(echo "$foreign" | tr : ' '); do
  mkdir -p "$merged$dir"
  mount --bind "$dir" "$merged$dir"
done
mount -t proc proc "$merged/proc"
mount --rbind /dev "$merged/dev"
mount -t tmpfs tmpfs "$merged/dev/shm"
[ -e "$merged/etc/hosts" ] || : >"$merged/etc/hosts"
mount --bind /etc/hosts "$merged/etc/hosts"
mount --bind /etc/resolv.conf "$merged/etc/resolv.conf"
mkdir -p "$merged/work"
mount --bind "$work" "$merged/work"
if [ "$net" = own ]; then ip link set lo up; fi
if [ "$1" = --host ]; then shift; exec "$@"; fi
exec chroot "$merged" "$@"
"""

# A plain environment for the root's programs: its PATH, not the host's.
ROOT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root", "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}


def why_not():
    """Why the test cannot run here, or "" when it can."""
    if os.geteuid() != 0:
        return "installing into a Debian root needs root (mount namespaces, chroot)"
    if not os.path.exists(STAMP):
        return f"no Debian 12 root at {BOOKWORM} (scripts/bookworm-root builds it)"
    for tool in ("cpack", "dpkg-shlibdeps", "dpkg-deb", "unshare", "ip"):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH (scripts/setup installs it)"
    if not os.path.exists(os.path.join(BUILD_DIR, "CPackConfig.cmake")):
        return f"no CPackConfig.cmake in {BUILD_DIR}: not a configured build (MUSTER_BUILD_DIR)"
    return ""


WHY_NOT = why_not()


def foreign_library_dirs():
    """The directories of the libraries the built binaries load from outside
    the system's (/lib, /usr/lib): none, or CUDA's and NCCL's."""
    dirs = set()
    for binary in ("launcher/muster", "launcher/muster-allreduce", "rendezvous/musterd",
                   "ctl/musterctl"):
        for line in run(["ldd", os.path.join(BUILD_DIR, binary)]).stdout.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[1] == "=>" and parts[2].startswith("/"):
                if not parts[2].startswith(("/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/")):
                    dirs.add(os.path.dirname(parts[2]))
    return sorted(dirs)


@unittest.skipIf(WHY_NOT, WHY_NOT)
class Install(unittest.TestCase):
    """cpack's .deb on a fresh Debian 12: apt-get install ./muster_*.deb,
    then muster, musterd, musterctl and muster-allreduce used from there."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix="muster-install-")
        cls.layers = os.path.join(cls.tmp, "layers")
        cls.work = os.path.join(cls.tmp, "work")
        for d in ("upper", "work", "merged"):
            os.makedirs(os.path.join(cls.layers, d))
        os.makedirs(cls.work)
        os.chmod(cls.work, 0o755)  # apt-get reads the .deb there as its user _apt
        cls.foreign = foreign_library_dirs()
        # The package, as a user makes it: cpack in the build directory
        # (packing what is built there; it builds nothing).
        cls.cpack = run(["cpack", "--config", os.path.join(BUILD_DIR, "CPackConfig.cmake"),
                         "-B", os.path.join(cls.tmp, "cpack")], timeout=300)
        debs = sorted(f for f in os.listdir(os.path.join(cls.tmp, "cpack"))
                      if f.endswith(".deb")) if cls.cpack.returncode == 0 else []
        cls.deb = os.path.join(cls.tmp, "cpack", debs[0]) if len(debs) == 1 else None
        cls.apt = None
        if cls.deb:
            shutil.copy(cls.deb, cls.work)
            # What a user types on a fresh machine; the sources are the root's own.
            cls.apt = cls.in_root(
                ["sh", "-c", "apt-get update -q && apt-get install -y -q --no-install-recommends "
                 f"/work/{os.path.basename(cls.deb)}"], timeout=600)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)
        super().tearDownClass()

    @classmethod
    def in_root(cls, args, timeout=120, net="host", host=False):
        """Runs `args` chrooted in the installed root (host=True: on the host,
        with the root at layers/merged), with a network namespace of its own
        for net="own". Returns CompletedProcess with text output."""
        unshare = ["unshare", "--mount", "--propagation", "private"]
        if net == "own":
            unshare.append("--net")
        argv = [*unshare, "sh", "-c", _ENTER, "sh", BOOKWORM, cls.layers, cls.work, net,
                ":".join(cls.foreign), *(["--host"] if host else []), *args]
        env = dict(os.environ) if host else ROOT_ENV
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def installed(self):
        """Fails the test, with cpack's or apt-get's words, unless the .deb was made and installed."""
        self.assertEqual(self.cpack.returncode, 0, f"cpack failed:\n{self.cpack.stdout}"
                         f"{self.cpack.stderr}")
        self.assertIsNotNone(self.deb, f"cpack made no single .deb:\n{self.cpack.stdout}")
        self.assertEqual(self.apt.returncode, 0,
                         f"apt-get install ./{os.path.basename(self.deb)} failed on a fresh "
                         f"Debian 12:\n{self.apt.stdout[-4000:]}{self.apt.stderr[-4000:]}")

    def sh(self, script, timeout=120, net="host"):
        """A shell script in the installed root; its CompletedProcess, checked to exit 0."""
        result = self.in_root(["sh", "-ec", script], timeout=timeout, net=net)
        self.assertEqual(result.returncode, 0,
                         f"in the root: {script}\n{result.stdout}{result.stderr}")
        return result

    def test_the_package_names_its_dependencies_by_debian_package(self):
        self.assertEqual(self.cpack.returncode, 0, self.cpack.stdout + self.cpack.stderr)
        version = run([MUSTER, "--version"]).stdout.split()[1]
        self.assertEqual(os.path.basename(self.deb), f"muster_{version}_amd64.deb")
        info = run(["dpkg-deb", "-f", self.deb]).stdout
        fields = dict(line.split(": ", 1) for line in info.splitlines() if ": " in line)
        self.assertEqual((fields["Package"], fields["Version"], fields["Architecture"]),
                         ("muster", version, "amd64"))
        depends = [d.split()[0] for d in fields["Depends"].split(", ")]
        # The libraries every binary loads, each as the Debian package that has it.
        for package in ("libc6", "libstdc++6", "libgrpc++1.51", "libprotobuf32", "passwd"):
            self.assertIn(package, depends, fields["Depends"])
        self.assertTrue(any(d.startswith("libabsl") for d in depends), fields["Depends"])
        # What host mode's job keeps its rendezvous on, so it outlives its hosting node.
        self.assertEqual(fields.get("Recommends"), "etcd-server", info)
        contents = run(["dpkg-deb", "-c", self.deb]).stdout
        files = {line.split()[-1].lstrip(".") for line in contents.splitlines()}
        expected = {"/usr/bin/muster", "/usr/bin/musterd", "/usr/bin/musterctl",
                    "/usr/bin/muster-allreduce", "/usr/lib/systemd/system/musterd.service",
                    "/usr/lib/sysusers.d/musterd.conf"}
        expected |= {f"/usr/share/muster/sbatch/{f}" for f in os.listdir(SBATCH)}
        self.assertLessEqual(expected, files, contents)

    def test_the_binaries_run_from_path(self):
        self.installed()
        result = self.sh("for p in muster musterd musterctl muster-allreduce; do command -v $p; done")
        self.assertEqual(result.stdout.split(), ["/usr/bin/muster", "/usr/bin/musterd",
                                                 "/usr/bin/musterctl", "/usr/bin/muster-allreduce"])
        built = run([MUSTER, "--version"]).stdout
        self.assertEqual(self.sh("muster --version").stdout, built)
        self.assertIn("--state-dir", self.sh("musterd --help").stdout)
        self.assertIn("health", self.sh("musterctl --help").stdout)
        # Every library each one loads is there: apt-get installed the Depends.
        missing = self.sh("for b in /usr/bin/muster*; do ldd $b; done").stdout
        self.assertNotIn("not found", missing)

    def test_a_job_of_the_bundled_worker_on_two_workers(self):
        self.installed()
        # scripts/demo's job, on 2 workers: muster-allreduce found on PATH.
        result = self.sh("muster --standalone --nproc-per-node 2 --no-python muster-allreduce "
                         "-b 1K -e 1M --json /work/allreduce.json", timeout=180)
        self.assertIn("# Wrong values         : 0 OK", result.stdout)
        with open(os.path.join(self.work, "allreduce.json")) as f:
            report = json.load(f)
        self.assertEqual((report["world_size"], report["backend"]), (2, "shm"))
        self.assertEqual([x["bytes"] for x in report["results"]],
                         [1024 << n for n in range(11)])
        for x in report["results"]:
            self.assertEqual(x["wrong"], 0, x)

    def test_the_sbatch_examples(self):
        self.installed()
        listed = self.sh("ls /usr/share/muster/sbatch && test -x "
                         "/usr/share/muster/sbatch/allreduce.sbatch").stdout.split()
        self.assertEqual(listed, sorted(os.listdir(SBATCH)))

    def test_the_systemd_unit_runs_the_installed_musterd(self):
        self.installed()
        # Where systemd looks for a package's units, naming the installed musterd.
        unit = self.sh("cat /usr/lib/systemd/system/musterd.service").stdout
        exec_start = [line.split("=", 1)[1] for line in unit.splitlines()
                      if line.startswith("ExecStart=")]
        self.assertEqual(len(exec_start), 1, unit)
        command = exec_start[0].split()
        self.assertEqual(command[0], "/usr/bin/musterd", unit)
        for line in ("Restart=on-failure", "User=musterd", "StateDirectory=musterd"):
            self.assertIn(line, unit.splitlines())
        self.assertEqual(command[command.index("--state-dir") + 1], "/var/lib/musterd")
        token = command[command.index("--token-file") + 1]
        port = command[command.index("--port") + 1]
        self.assertTrue(token.startswith("/etc/musterd/"), unit)
        self.assertEqual(self.sh("getent passwd musterd | cut -d: -f7").stdout.strip(),
                         "/usr/sbin/nologin")
        # systemd's own reading of the unit (keys, values, the program
        # executable), from the host: the root has no systemd. The copy
        # names the installed musterd by its path from the host.
        if shutil.which("systemd-analyze"):
            merged = os.path.join(self.layers, "merged")
            copy = os.path.join(self.work, "musterd.service")
            with open(copy, "w") as f:
                f.write(unit.replace("ExecStart=/usr/bin/", f"ExecStart={merged}/usr/bin/"))
            result = self.in_root(["systemd-analyze", "verify", copy], host=True)
            self.assertEqual((result.returncode, result.stderr), (0, ""), result.stdout)

        # ExecStart as systemd runs it: as musterd, /var/lib/musterd made
        # for it (StateDirectory=), the token as the unit's comment says.
        # A network namespace of its own: the unit's port is fixed.
        script = f"""
install -d /etc/musterd
(umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > {token})
chown musterd:musterd {token}
install -d -o musterd -g musterd -m 700 /var/lib/musterd
setpriv --reuid musterd --regid musterd --init-groups {exec_start[0]} 2> /work/musterd.err &
pid=$!
for i in $(seq 100); do
  musterctl health --endpoint 127.0.0.1:{port} --timeout 1 > /work/health.out 2>&1 && break
  sleep 0.1
done
kill -TERM $pid
wait $pid
ls /var/lib/musterd
"""
        result = self.in_root(["sh", "-ec", script], net="own", timeout=60)
        with open(os.path.join(self.work, "musterd.err")) as f:
            log = f.read()
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr + log)
        with open(os.path.join(self.work, "health.out")) as f:
            self.assertEqual(f.read(), f"127.0.0.1:{port}: SERVING\n")
        self.assertIn("journal", result.stdout.split(), log)
        self.assertIn("auth: token from /etc/musterd/token", log)


if __name__ == "__main__":
    unittest.main()
