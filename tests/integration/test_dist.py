"""Installing without root (issue 34): the tarball and the wheel that
`cmake --build BUILD --target dist` makes (packaging/dist.py), used on a
fresh Debian 12 by an unprivileged user, as a cluster user without root
would: the tarball unpacked anywhere, the wheel installed with pip into a
venv, and a 2-worker job of muster-allreduce from each, through `muster`
and through `python -m muster`.

The fresh machine is scripts/bookworm-root's minbase root, entered as
test_install enters it (an overlay, so it stays fresh; the directories of
the libraries the build loads from outside Debian, CUDA's and NCCL's, at
their paths, as a machine of this kind has them). It has no gRPC, no
Protobuf, no Abseil; for the wheel, apt-get adds python3-venv from the
root's own sources first (what a user's machine with Python has). Skipped,
with the reason, where the root is not built or the tests do not run as
root."""
import glob
import json
import os
import shutil
import subprocess
import tempfile
import unittest

from harness import MUSTER, run
from test_install import _ENTER, BOOKWORM, BUILD_DIR, ROOT_ENV, STAMP, foreign_library_dirs

NOBODY = "setpriv --reuid=65534 --regid=65534 --clear-groups env HOME=/tmp/home"


def why_not():
    if os.geteuid() != 0:
        return "entering a Debian root needs root (mount namespaces, chroot)"
    if not os.path.exists(STAMP):
        return f"no Debian 12 root at {BOOKWORM} (scripts/bookworm-root builds it)"
    if not os.path.exists(os.path.join(BUILD_DIR, "CMakeCache.txt")):
        return f"no CMakeCache.txt in {BUILD_DIR}: not a configured build (MUSTER_BUILD_DIR)"
    return ""


WHY_NOT = why_not()


@unittest.skipIf(WHY_NOT, WHY_NOT)
class Dist(unittest.TestCase):
    """The dist target's tarball and wheel on a fresh Debian 12, as nobody."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix="muster-dist-")
        cls.work = os.path.join(cls.tmp, "work")
        os.makedirs(cls.work)
        os.chmod(cls.work, 0o755)
        cls.foreign = foreign_library_dirs()
        # As a user makes them; the binaries are built already.
        cls.made = run(["cmake", "--build", BUILD_DIR, "--target", "dist"], timeout=300)
        dist = os.path.join(BUILD_DIR, "dist")
        cls.tarballs = sorted(glob.glob(os.path.join(dist, "muster-*-linux-x86_64.tar.gz")))
        cls.wheels = sorted(glob.glob(os.path.join(dist, "muster-*-py3-none-linux_x86_64.whl")))
        for path in cls.tarballs + cls.wheels:
            shutil.copy(path, cls.work)
        cls.version = run([MUSTER, "--version"]).stdout.split()[1]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)
        super().tearDownClass()

    def fresh_root(self, name):
        """An overlay of its own on the fresh root: its layers' directory."""
        layers = os.path.join(self.tmp, name)
        for d in ("upper", "work", "merged"):
            os.makedirs(os.path.join(layers, d))
        return layers

    def sh(self, layers, script, timeout=240):
        """`script` (sh -e) in the root, as root, in a network of its own
        (loopback); its CompletedProcess, checked to exit 0."""
        argv = ["unshare", "--mount", "--propagation", "private", "--net", "sh", "-c", _ENTER,
                "sh", BOOKWORM, layers, self.work, "own", ":".join(self.foreign),
                "sh", "-ec", script]
        result = subprocess.run(argv, env=ROOT_ENV, capture_output=True, text=True,
                                timeout=timeout, stdin=subprocess.DEVNULL)
        self.assertEqual(result.returncode, 0, f"in the root: {script}\n{result.stdout}"
                         f"{result.stderr}")
        return result

    def made_both(self):
        self.assertEqual(self.made.returncode, 0, self.made.stdout + self.made.stderr)
        self.assertEqual([os.path.basename(p) for p in self.tarballs],
                         [f"muster-{self.version}-linux-x86_64.tar.gz"])
        self.assertEqual([os.path.basename(p) for p in self.wheels],
                         [f"muster-{self.version}-py3-none-linux_x86_64.whl"])

    def assert_two_worker_job(self, report_path):
        with open(report_path) as f:
            report = json.load(f)
        self.assertEqual(report["world_size"], 2)
        self.assertEqual([x["bytes"] for x in report["results"]], [1024 << n for n in range(7)])
        for x in report["results"]:
            self.assertEqual(x["wrong"], 0, x)

    def test_the_tarball_runs_from_anywhere_as_an_unprivileged_user(self):
        self.made_both()
        layers = self.fresh_root("tarball")
        tarball = os.path.basename(self.tarballs[0])
        # No gRPC, Protobuf, Abseil or Python on this machine.
        bare = self.sh(layers, "ls /usr/lib/x86_64-linux-gnu; command -v python3 || true").stdout
        for library in ("libgrpc", "libprotobuf", "libabsl", "libyaml"):
            self.assertNotIn(library, bare)
        self.assertNotIn("/usr/bin/python3", bare)
        result = self.sh(layers, f"""
            mkdir -m 1777 /work/out
            {NOBODY} sh -ec '
              mkdir -p /tmp/home/somewhere && cd /tmp/home/somewhere
              tar -xzf /work/{tarball}
              ldd muster-*/bin/* | grep "not found" && exit 1
              cd /
              /tmp/home/somewhere/muster-*/bin/muster --standalone --nproc-per-node 2 \\
                --no-python muster-allreduce -b 1K -e 64K --json /work/out/tarball.json
              ls /tmp/home/somewhere/muster-*/share/muster/sbatch
              id -u'""")
        self.assertEqual(result.stdout.split()[-1], "65534")
        self.assertIn("allreduce.sbatch", result.stdout)
        self.assert_two_worker_job(os.path.join(self.work, "out", "tarball.json"))

    def test_the_wheel_installs_with_pip_into_a_venv_and_runs(self):
        self.made_both()
        layers = self.fresh_root("wheel")
        wheel = os.path.basename(self.wheels[0])
        # A machine with Python: the root's own python3-venv (the root's
        # network is its own, so apt-get runs on the host's side of it).
        apt = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", _ENTER, "sh", BOOKWORM,
             layers, self.work, "host", ":".join(self.foreign), "sh", "-c",
             "apt-get update -q && apt-get install -y -q --no-install-recommends python3-venv"],
            env=ROOT_ENV, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        self.assertEqual(apt.returncode, 0, apt.stdout[-3000:] + apt.stderr[-3000:])
        result = self.sh(layers, f"""
            mkdir -m 1777 /work/wheel-out
            {NOBODY} sh -ec '
              python3 -m venv /tmp/home/venv
              /tmp/home/venv/bin/pip install --no-index --no-cache-dir \\
                --disable-pip-version-check --quiet /work/{wheel}
              export PATH=/tmp/home/venv/bin:$PATH
              for p in muster musterd musterctl muster-allreduce; do command -v $p; done
              cd /
              muster --standalone --nproc-per-node 2 --no-python muster-allreduce \\
                -b 1K -e 64K --json /work/wheel-out/muster.json
              python -m muster --standalone --nproc-per-node 2 --no-python muster-allreduce \\
                -b 1K -e 64K --json /work/wheel-out/python-m.json
              python -m muster --version'""", timeout=600)
        lines = result.stdout.split("\n")
        for program in ("muster", "musterd", "musterctl", "muster-allreduce"):
            self.assertIn(f"/tmp/home/venv/bin/{program}", lines)
        self.assertIn(f"muster {self.version}", lines)
        self.assert_two_worker_job(os.path.join(self.work, "wheel-out", "muster.json"))
        self.assert_two_worker_job(os.path.join(self.work, "wheel-out", "python-m.json"))


if __name__ == "__main__":
    unittest.main()
