#!/usr/bin/env python3
"""A small Hugging Face accelerate training script: Accelerator() takes its
settings from what the launcher set (ACCELERATE_MIXED_PRECISION and the
rest), as under `accelerate launch --config_file FILE`. It runs unchanged
under `muster --accelerate-config FILE` and is deterministic, so the two
can be compared: --out writes the final parameters (main process) and the
precision the Accelerator chose.
"""
import argparse
import json

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", help="the main process writes the final parameters here (JSON)")
    args = parser.parse_args()

    accelerator = Accelerator()
    set_seed(1234)
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(256, 8, generator=generator)
    y = x @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.1 * torch.randn(256, 1, generator=generator)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=generator)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for _ in range(args.epochs):
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process and args.out:
        params = [p.detach().float().flatten().tolist()
                  for p in accelerator.unwrap_model(model).parameters()]
        with open(args.out, "w") as f:
            json.dump({"params": params, "mixed_precision": accelerator.mixed_precision,
                       "num_processes": accelerator.num_processes}, f)
    accelerator.end_training()


if __name__ == "__main__":
    main()
