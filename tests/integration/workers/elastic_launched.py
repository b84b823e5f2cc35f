"""Writes torch.distributed.is_torchelastic_launched() to the file given
with --out-file: True under a launcher that sets torchrun's environment."""
import argparse

import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--out-file", "--out_file", dest="out_file", required=True)
args = parser.parse_args()
with open(args.out_file, "w") as out:
    out.write(str(dist.is_torchelastic_launched()))
