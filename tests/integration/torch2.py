"""PyTorch 2.x for the tests: Debian's python3-torch in roots of their own
(scripts/torch2-root builds them once per machine), trixie's 2.6 (Python
3.13) and sid's 2.14 (Python 3.14, with accelerate), each entered only
through a private mount namespace, so nothing of the host stays mounted in
it.

muster goes in as the dist target packs it (packaging/dist.py: its
libraries beside it, found through its RPATH), so it runs there as on a machine whose only
Python is that root's, with its torch. The test's directory is mounted at
the same path inside, and the host's /etc/hosts, so this host's name
resolves."""
import os
import shutil
import subprocess
import sys
import tempfile

from harness import MUSTER, ROOT as ROOT_DIR

sys.path.insert(0, os.path.join(ROOT_DIR, "packaging"))
import dist  # noqa: E402

BUNDLE_IN_ROOT = "/opt/muster"

_ENTER = r"""set -e
root=$1; shift; bundle=$1; shift; work=$1; shift
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount -t tmpfs tmpfs "$root/dev/shm"
mkdir -p "$root/opt/muster" "$root$work"
mount --bind "$bundle" "$root/opt/muster"
mount --bind "$work" "$root$work"
mount --bind /etc/hosts "$root/etc/hosts"
exec /usr/sbin/chroot "$root" "$@"
"""


class Root:
    """One PyTorch root: where it is, and how the tests enter it."""

    def __init__(self, torch, suite, path):
        self.torch = torch  # "2.6": what the tests call it
        self.suite = suite
        self.path = path
        self.stamp = os.path.join(path, ".muster-torch2")

    def available(self):
        """Why the root cannot be used, or "" when it can."""
        if not os.path.exists(self.stamp):
            return (f"no PyTorch {self.torch} root at {self.path} "
                    f"(scripts/torch2-root {self.suite} builds it)")
        if os.geteuid() != 0:
            return f"entering the PyTorch {self.torch} root needs root (mount namespaces, chroot)"
        return ""

    def version(self):
        with open(self.stamp) as f:
            return f.read().strip()

    def enter_argv(self, args, bundle, work):
        """The command line that runs `args` in the root, work and the bundle mounted."""
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _ENTER, "sh",
                self.path, bundle, work, *args]

    def run(self, args, bundle, work, env, timeout):
        """Runs `args` in the root, with `env` as its whole environment; work
        and the bundle mounted. Returns CompletedProcess with text output."""
        return subprocess.run(self.enter_argv(args, bundle, work), env=env, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)


TORCH26 = Root("2.6", "trixie", os.environ.get(
    "MUSTER_TORCH26_ROOT", os.environ.get("MUSTER_TORCH2_ROOT", "/var/cache/muster/trixie-torch")))
TORCH214 = Root("2.14", "sid", os.environ.get("MUSTER_TORCH214_ROOT",
                                              "/var/cache/muster/sid-torch"))


def make_bundle(directory):
    """muster as the dist target packs it (packaging/dist.py): bin/muster,
    its libraries in lib/muster/, found through its RPATH."""
    dist.stage([MUSTER], ROOT_DIR, directory)
    return directory


class WithBundle:
    """A test class's mixin: self.bundle, muster packed for the root, made
    once for the class."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._bundle_dir = tempfile.mkdtemp(prefix="muster-bundle-")
        cls.bundle = make_bundle(os.path.join(cls._bundle_dir, "bundle"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls._bundle_dir, ignore_errors=True)
        super().tearDownClass()


def root_env(**extra):
    """A plain environment for the root's programs: its PATH, not the host's.
    Debian builds TCPStore without libuv, which torch 2.4+ asks for by
    default: USE_LIBUV=0 for every worker."""
    e = {"PATH": "/opt/muster/bin:/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
         "USE_LIBUV": "0", "PYTHON_EXEC": "/usr/bin/python3"}
    e.update({k: str(v) for k, v in extra.items()})
    return e


def read_environments(directory, ranks):
    """Each rank's environment as `env > DIRECTORY/env.$LOCAL_RANK` wrote it."""
    envs = []
    for rank in range(ranks):
        with open(os.path.join(directory, f"env.{rank}")) as f:
            envs.append(dict(line.split("=", 1) for line in f.read().splitlines() if "=" in line))
    return envs


def assert_same_environments(test, ours, theirs, explained, per_run, muster_only):
    """muster's workers' environments (`ours`) against the reference's, rank
    by rank and variable by variable: the same, but for `explained` ({name:
    (ours, theirs)}), `per_run` (set under both, values of their own) and
    `muster_only` (set only by muster)."""
    for rank, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        for var in sorted(set(a) | set(b)):
            with test.subTest(var=var, rank=rank):
                if var in explained:
                    test.assertEqual((a.get(var), b.get(var)), explained[var])
                elif var in muster_only:
                    test.assertIn(var, a)
                    test.assertNotIn(var, b)
                elif var in per_run:
                    test.assertIn(var, a)
                    test.assertIn(var, b)
                else:
                    test.assertEqual(a.get(var), b.get(var))
