"""A worker of test_torchrun_suite (PyTorch's launcher tests, run from
outside): prints the variables every torchrun worker has, failing on one
that is missing, then touches a file named by its global rank in the given
directory, or raises when asked to fail."""
import argparse
import os
import pathlib

REQUIRED = ("LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
            "WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
            "OMP_NUM_THREADS", "TEST_SENTINEL_PARENT", "TORCHELASTIC_ERROR_FILE")

parser = argparse.ArgumentParser()
parser.add_argument("--fail", action="store_true")
parser.add_argument("--touch-file-dir", "--touch_file_dir", dest="touch_file_dir")
args = parser.parse_args()
for name in REQUIRED:
    print(f"{name} = {os.environ[name]}")
if args.fail:
    raise RuntimeError("asked to fail with --fail")
path = pathlib.Path(args.touch_file_dir, os.environ["RANK"])
path.touch()
print(f"created {path}")
