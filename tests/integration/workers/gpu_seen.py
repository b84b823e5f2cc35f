"""Reads an agent's event log (argv[1]) and exits 0 when a gpu_sample shows
a GPU busy, holding memory, with local ranks 0 and 1 on it: what the real
NVML must tell the agent of gpu_work.py's two ranks without set_device
(scripts/gpu-check). The GPU is named by its NVML index, which is not 0
where CUDA_VISIBLE_DEVICES starts elsewhere. Prints every gpu_sample."""
import json
import re
import sys

SEEN = re.compile(r"(?:^|; )GPU \d+ (\d+)% busy, ([\d.]+) GiB of ([\d.]+) GiB, local ranks 0, 1(;|$)")

with open(sys.argv[1]) as f:
    samples = [e["detail"] for e in map(json.loads, f) if e["kind"] == "gpu_sample"]
for sample in samples:
    print("gpu_sample:", sample)
for sample in samples:
    m = SEEN.search(sample)
    if m and int(m[1]) > 0 and float(m[2]) > 0 and float(m[3]) > 0:
        sys.exit(0)
sys.exit(f"gpu_seen: no gpu_sample of {len(samples)} shows a GPU busy, holding memory, "
         "with local ranks 0, 1 on it")
