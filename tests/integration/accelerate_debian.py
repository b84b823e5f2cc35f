#!/usr/bin/python3
"""`accelerate launch` of Debian sid's accelerate 1.14, run unchanged but
for two things, as the reference test_accelerate compares muster with.

Its torchrun runs in-process, so torchrun_debian's TCPStore without libuv
is put in first (Debian builds TCPStore without libuv). And DeepSpeed,
which Debian does not package, is stood in for where accelerate only asks
whether it is installed and for the name of its environment file: its
single-node launch is torchrun's, with the variables accelerate sets, and
needs no DeepSpeed until the script imports it."""
import sys
import types

import torchrun_debian  # noqa: F401  (no libuv)

from accelerate.commands import launch  # noqa: E402

_deepspeed_launcher = launch.deepspeed_launcher


def _stand_in_for_deepspeed(args):
    runner = types.ModuleType("deepspeed.launcher.runner")
    runner.DEEPSPEED_ENVIRONMENT_NAME = ".deepspeed_env"
    for name, module in (("deepspeed", types.ModuleType("deepspeed")),
                         ("deepspeed.launcher", types.ModuleType("deepspeed.launcher")),
                         ("deepspeed.launcher.runner", runner)):
        sys.modules.setdefault(name, module)
    return _deepspeed_launcher(args)


launch.is_deepspeed_available = lambda: True
launch.deepspeed_launcher = _stand_in_for_deepspeed

if __name__ == "__main__":
    sys.exit(launch.main())
