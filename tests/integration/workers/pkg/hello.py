"""Run with -m: prints how it was started."""
import os
import sys

print(f"module hello rank {os.environ['RANK']} argv0={os.path.basename(sys.argv[0])}", flush=True)
