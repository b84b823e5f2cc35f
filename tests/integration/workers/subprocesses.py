"""Starts processes of its own the ways training scripts do (issue 33): a
DataLoader with two workers under the spawn start method, and a
multiprocessing Pool under fork and under spawn. Prints what each gave."""
import multiprocessing

import torch
from torch.utils.data import DataLoader, Dataset


class Numbers(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return i


def square(x):
    return x * x


def main():
    loader = DataLoader(Numbers(), batch_size=2, num_workers=2, multiprocessing_context="spawn")
    seen = sorted(int(x) for batch in loader for x in batch)
    print(f"dataloader spawn: {seen}", flush=True)
    for method in ("fork", "spawn"):
        with multiprocessing.get_context(method).Pool(2) as pool:
            print(f"pool {method}: {pool.map(square, range(4))}", flush=True)
    assert torch.tensor([1.0]).sum().item() == 1.0


if __name__ == "__main__":
    main()
