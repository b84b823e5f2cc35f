#!/usr/bin/python3
"""Debian's torchrun (PyTorch 1.13) under Python 3.11, with its one crash fixed.

Under 3.11 `for s in Std` no longer yields NONE (0) or ALL (3), so torchrun's
default `-r 0 -t 0` dies in Std.from_str. This wrapper replaces from_str with
a version that maps the numbers directly, then runs torchrun unchanged, so
tests and benchmarks compare muster with torchrun's real behaviour.
"""
import re
import sys

from torch.distributed.elastic.multiprocessing import api


def _from_str(cls, vm):
    if re.match(api._VALUE_REGEX, vm):
        return cls(int(vm))
    if re.match(api._MAPPING_REGEX, vm):
        return {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm} does not match: <{api._VALUE_REGEX}> or <{api._MAPPING_REGEX}>")


api.Std.from_str = classmethod(_from_str)

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
