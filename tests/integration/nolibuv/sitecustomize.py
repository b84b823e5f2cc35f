"""The workers' side of torchrun_debian.py, for a torchrun whose static
rendezvous shares its store with the workers (as `accelerate launch` runs
it): torch 2.14's worker connects to that store as a client that asks for
libuv whatever USE_LIBUV says, which Debian's build lacks. On PYTHONPATH,
only for the reference's workers, this makes that client a non-libuv one."""
import sys

import torch.distributed as dist

# (torch.distributed.rendezvous, the name, is a function that hides the module.)
rendezvous = sys.modules["torch.distributed.rendezvous"]

_TCPStore = dist.TCPStore


def _tcp_store(*args, **kwargs):
    kwargs["use_libuv"] = False
    return _TCPStore(*args, **kwargs)


dist.TCPStore = _tcp_store
rendezvous.TCPStore = _tcp_store
