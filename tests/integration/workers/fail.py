"""A worker that fails in a chosen way on one rank; the others wait.

  fail.py MODE TARGET_RANK [DIR]

MODE: exit1 (exit code 1), segv (SIGSEGV), raise (RuntimeError under @record).
Other ranks sleep up to 30 s (they are stopped by the agent). With DIR, each
rank writes DIR/pid.<RANK>, and the failing rank waits (up to 20 s) until
every rank has, so the test knows whom the agent must stop.
"""
import os
import signal
import sys
import time

from torch.distributed.elastic.multiprocessing.errors import record

mode, target = sys.argv[1], int(sys.argv[2])
directory = sys.argv[3] if len(sys.argv) > 3 else None
rank = int(os.environ["RANK"])


@record
def main():
    if directory:
        path = os.path.join(directory, f"pid.{rank}")
        with open(path + ".tmp", "w") as f:  # renamed: never seen empty
            f.write(str(os.getpid()))
        os.replace(path + ".tmp", path)
    if rank == target:
        world = int(os.environ["WORLD_SIZE"])
        deadline = time.monotonic() + 20
        while directory and time.monotonic() < deadline and not all(
                os.path.exists(os.path.join(directory, f"pid.{r}")) for r in range(world)):
            time.sleep(0.02)
        if mode == "exit1":
            sys.exit(1)
        if mode == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if mode == "raise":
            raise RuntimeError(f"rank {rank} raised on purpose")
    time.sleep(30)


if __name__ == "__main__":
    main()
