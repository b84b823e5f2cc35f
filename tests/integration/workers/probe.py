"""Records what the interpreter made of this worker, to compare a cold start
with one forked from --preload's interpreter (issue 33).

  probe.py DIR [ARGS...]   (or python -m probe DIR, with workers/ on PYTHONPATH)

Writes DIR/probe.<RANK>.<TORCHELASTIC_RESTART_COUNT>.json. With DIR/fail-once,
rank 1 of the first attempt exits 1 once it and rank 0 have written theirs.
"""
import json
import os
import random
import resource
import signal
import sys
import time


def record():
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    return {
        "argv": sys.argv,
        "orig_argv": getattr(sys, "orig_argv", None),
        "path0": sys.path[0],
        "path": sys.path,
        "file": getattr(main, "__file__", None),
        "name": main.__name__,
        "main_names": sorted(vars(main)),  # its own names, and none of muster's
        "loader": type(getattr(main, "__loader__", None)).__name__,
        "spec": getattr(spec, "name", None),
        "package": getattr(main, "__package__", None),
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "own_group": os.getpgid(0) == os.getpid(),
        "ppid": os.getppid(),
        "parent": os.path.basename(os.readlink(f"/proc/{os.getppid()}/exe")),
        "signals": {s.name: str(signal.getsignal(s)) for s in signal.valid_signals()
                    if isinstance(s, signal.Signals) and s not in (signal.SIGKILL, signal.SIGSTOP)},
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
        "affinity": sorted(os.sched_getaffinity(0)),
        "flags": str(sys.flags),
        "stdout_buffered": not sys.stdout.write_through if hasattr(sys.stdout, "write_through")
                           else None,
        "random": random.random(),
        "stdin": os.path.realpath("/proc/self/fd/0"),
    }


def main():
    directory = sys.argv[1]
    rank, restart = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
    out = os.path.join(directory, f"probe.{rank}.{restart}.json")
    with open(out + ".tmp", "w") as f:
        json.dump(record(), f, indent=1, sort_keys=True)
    os.replace(out + ".tmp", out)
    print(f"probe {rank} wrote {out}")
    if rank == "1" and restart == "0" and os.path.exists(os.path.join(directory, "fail-once")):
        # Not before rank 0 has written its own: the failure stops it (at most 60 s).
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(directory, "probe.0.0.json")):
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        sys.exit(1)


if __name__ == "__main__":
    main()
