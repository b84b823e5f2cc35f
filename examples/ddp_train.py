#!/usr/bin/env python3
"""A small, real PyTorch DDP training script: gloo, env:// rendezvous,
DistributedSampler, DistributedDataParallel. It runs unchanged under torchrun
and under muster, and is deterministic, so the two can be compared.

Extra flags exist for muster's tests: --out writes the final parameters (rank
0), --crash-rank/--crash-marker make one rank fail once, --raise-rank makes a
rank raise (recorded by @record into TORCHELASTIC_ERROR_FILE).
"""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--out", help="rank 0 writes the final parameters here (JSON)")
    parser.add_argument("--env-out", help="each rank writes its environment to ENV_OUT.<rank>")
    parser.add_argument("--crash-rank", type=int, default=-1,
                        help="this rank exits 1 once (while --crash-marker does not exist)")
    parser.add_argument("--crash-marker")
    parser.add_argument("--raise-rank", type=int, default=-1,
                        help="this rank raises a RuntimeError")
    return parser.parse_args()


def dataset():
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(256, 8, generator=generator)
    w = torch.arange(1.0, 9.0).unsqueeze(1)
    y = x @ w + 0.1 * torch.randn(256, 1, generator=generator)
    return TensorDataset(x, y)


@record
def main():
    args = parse_args()
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    world = dist.get_world_size()
    if args.env_out:
        with open(f"{args.env_out}.{rank}", "w") as f:
            json.dump(dict(os.environ), f)
    if rank == args.raise_rank:
        raise RuntimeError(f"rank {rank} raised on purpose")
    if rank == args.crash_rank and args.crash_marker and not os.path.exists(args.crash_marker):
        open(args.crash_marker, "w").close()
        print(f"rank {rank}: crashing once on purpose", file=sys.stderr, flush=True)
        os._exit(1)

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = dataset()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=7)
    # Each rank sees 1/world of the data; the global batch stays the same.
    loader = DataLoader(data, batch_size=args.batch_size // world, sampler=sampler)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(1)
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.detach()
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch}: mean loss {total.item() / (len(loader) * world):.4f}", flush=True)

    if rank == 0 and args.out:
        params = {name: p.detach().flatten().tolist() for name, p in model.module.named_parameters()}
        with open(args.out, "w") as f:
            json.dump({"world_size": world,
                       "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                       "params": params}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
