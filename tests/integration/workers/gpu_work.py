"""A PyTorch worker that keeps a GPU busy for SECONDS (argv[1]): on
cuda:LOCAL_RANK with --set-device, else on plain "cuda", which is GPU 0 for
every rank: the fault muster's GPU check exists for (scripts/gpu-check)."""
import os
import sys
import time

import torch

seconds = float(sys.argv[1])
if "--set-device" in sys.argv:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
a = torch.randn(2048, 2048, device="cuda")
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    a = (a @ a).tanh()
    torch.cuda.synchronize()
print("rank", os.environ["RANK"], "worked on", torch.cuda.current_device())
