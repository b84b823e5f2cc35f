#!/usr/bin/python3
"""muster for a machine where its user has no root: `cmake --build BUILD
--target dist` runs this, making in BUILD/dist/

  muster-VERSION-linux-x86_64.tar.gz   bin/ (muster, musterd, musterctl,
      muster-allreduce), lib/muster/ (every library they load but glibc's,
      the C++ runtime and CUDA's), share/muster/sbatch/; the binaries find
      lib/muster through an RPATH relative to themselves, so the tree runs
      from wherever it is unpacked (`tar -xzf ... --strip-components=1 -C
      ~/.local` puts muster on a user's PATH);
  muster-VERSION-py3-none-linux_x86_64.whl   the same files for
      `pip install --no-index ./muster-*.whl` into a virtual environment:
      the four programs in its bin/, the libraries in its lib/muster/, and
      `python -m muster` as the launcher.

The wheel is built offline by Debian's setuptools and wheel (pip wheel
--no-build-isolation --no-index). A build with the NCCL backend loads the
CUDA runtime and NCCL from where this build found them, as an installed
muster-allreduce does (README, Install): those are the GPU machine's own.

usage: dist.py --version V --out DIR --source SRC BINARY..."""
import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

PLATFORM = "linux_x86_64"
# What every Debian (and every distribution) has: glibc's libraries, the C++
# runtime, and the dynamic loader.
SYSTEM = ("linux-vdso", "ld-linux", "libc.so", "libm.so", "libdl.so", "libpthread.so", "librt.so",
          "libresolv.so", "libstdc++.so", "libgcc_s.so")
SYSTEM_DIRS = ("/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/")


def run(argv, **kwargs):
    return subprocess.run(argv, check=True, **kwargs)


def loaded_libraries(binary):
    """(name, path) of each library `binary` loads, as ldd finds them."""
    out = run(["ldd", binary], capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>" and parts[2].startswith("/"):
            yield parts[0], parts[2]


def stage(binaries, source, root):
    """bin/, lib/muster/ and share/muster/sbatch/ under `root`."""
    bin_dir, lib_dir = os.path.join(root, "bin"), os.path.join(root, "lib", "muster")
    sbatch_dir = os.path.join(root, "share", "muster", "sbatch")
    for d in (bin_dir, lib_dir, sbatch_dir):
        os.makedirs(d)
    for binary in binaries:
        # A system library's directory is the system's; any other (CUDA's,
        # NCCL's) is the GPU machine's, found where this build found it.
        foreign = []
        for name, path in loaded_libraries(binary):
            if name.startswith(SYSTEM):
                continue
            if not path.startswith(SYSTEM_DIRS):
                foreign.append(os.path.dirname(path))
                continue
            target = os.path.join(lib_dir, name)
            if not os.path.exists(target):
                shutil.copy(path, target)
                run(["strip", "--strip-debug", target])
        installed = os.path.join(bin_dir, os.path.basename(binary))
        shutil.copy(binary, installed)
        run(["strip", "--strip-debug", installed])
        rpath = ":".join(["$ORIGIN/../lib/muster", *sorted(set(foreign))])
        # DT_RPATH, not RUNPATH: it also serves the libraries' own dependencies.
        run(["patchelf", "--force-rpath", "--set-rpath", rpath, installed])
    sbatch = os.path.join(source, "scripts", "sbatch")
    for name in sorted(os.listdir(sbatch)):
        shutil.copy(os.path.join(sbatch, name), sbatch_dir)


def make_tarball(root, out, base):
    path = os.path.join(out, f"{base}.tar.gz")

    def normalize(info):
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    with tarfile.open(path, "w:gz") as tar:
        tar.add(root, arcname=base, filter=normalize)
    return path


SETUP_PY = '''\
import os
from setuptools import setup
from wheel.bdist_wheel import bdist_wheel


class PlatformWheel(bdist_wheel):
    """Native programs, no Python extension: any Python 3, this platform."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        return "py3", "none", "{platform}"


def files(directory):
    return [os.path.join(directory, name) for name in sorted(os.listdir(directory))]


setup(
    name="muster",
    version="{version}",
    description="An elastic launcher for distributed training, a drop-in for torchrun",
    packages=["muster"],
    data_files=[("bin", files("tree/bin")), ("lib/muster", files("tree/lib/muster")),
                ("share/muster/sbatch", files("tree/share/muster/sbatch"))],
    python_requires=">=3.8",
    cmdclass={{"bdist_wheel": PlatformWheel}},
)
'''

INIT_PY = '''\
"""muster, the launcher: its programs are installed beside this
environment's python (bin/), with their libraries in lib/muster/.
`python -m muster ...` is `muster ...`."""
import os
import sys
import sysconfig

__version__ = "{version}"


def program(name="muster"):
    """The installed program `name`: where pip put it, for any install scheme."""
    try:
        from importlib import metadata
        for entry in metadata.files("muster") or ():
            if entry.parts[-2:] == ("bin", name):
                return str(entry.locate())
    except Exception:  # an install without its RECORD: look where scripts go
        pass
    return os.path.join(sysconfig.get_path("scripts"), name)


def main():
    path = program()
    try:
        os.execv(path, ["muster", *sys.argv[1:]])
    except OSError as error:
        sys.exit(f"python -m muster: cannot run {{path}}: {{error.strerror}}; "
                 "reinstall muster (pip install --force-reinstall ./muster-*.whl)")
'''

MAIN_PY = '''\
from muster import main

main()
'''


def make_wheel(root, out, version):
    with tempfile.TemporaryDirectory(prefix="muster-wheel-") as src:
        shutil.copytree(root, os.path.join(src, "tree"), symlinks=True)
        os.makedirs(os.path.join(src, "muster"))
        for name, text in (("setup.py", SETUP_PY), ("muster/__init__.py", INIT_PY),
                           ("muster/__main__.py", MAIN_PY)):
            with open(os.path.join(src, name), "w") as f:
                f.write(text.format(version=version, platform=PLATFORM))
        run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
             "--no-index", "--disable-pip-version-check", "--quiet", "-w", out, src],
            cwd=src)
    return os.path.join(out, f"muster-{version}-py3-none-{PLATFORM}.whl")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("binaries", nargs="+")
    args = parser.parse_args()
    for tool in ("ldd", "strip", "patchelf"):
        if shutil.which(tool) is None:
            sys.exit(f"dist: no {tool} on PATH (scripts/setup installs it)")
    base = f"muster-{args.version}-{PLATFORM.replace('_', '-', 1)}"
    os.makedirs(args.out, exist_ok=True)
    for old in os.listdir(args.out):
        if old.startswith("muster-") and old.endswith((".tar.gz", ".whl")):
            os.remove(os.path.join(args.out, old))
    with tempfile.TemporaryDirectory(prefix="muster-dist-", dir=args.out) as work:
        root = os.path.join(work, base)
        stage(args.binaries, args.source, root)
        tarball = make_tarball(root, args.out, base)
        wheel = make_wheel(root, args.out, args.version)
    for path in (tarball, wheel):
        if not os.path.exists(path):
            sys.exit(f"dist: {path} was not made")
        print(f"dist: {path} ({os.path.getsize(path) / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
