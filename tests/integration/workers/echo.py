"""A worker that prints its rank on stdout and stderr, and its arguments."""
import os
import sys

rank = os.environ["RANK"]
print(f"out from {rank} args={' '.join(sys.argv[1:])}", flush=True)
print(f"err from {rank}", file=sys.stderr, flush=True)
