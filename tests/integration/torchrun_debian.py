#!/usr/bin/python3
"""torchrun of Debian's PyTorch 2.x (trixie's 2.6, sid's 2.14), run
unchanged but for one thing.

Debian builds TCPStore without libuv, while torch 2.4+'s rendezvous asks for
libuv by default (and passes use_libuv=True itself in places), so its
torchrun fails to start its store. This wrapper makes every TCPStore the
rendezvous creates a non-libuv one, then runs torchrun's main: the reference
muster's tests compare with (tests/integration/torch2.py runs it in the
PyTorch 2.x roots)."""
import sys

import torch.distributed as dist

_TCPStore = dist.TCPStore


def _tcp_store(*args, **kwargs):
    kwargs["use_libuv"] = False
    return _TCPStore(*args, **kwargs)


dist.TCPStore = _tcp_store

from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend  # noqa: E402
from torch.distributed.elastic.utils import distributed as elastic_distributed  # noqa: E402

c10d_rendezvous_backend.TCPStore = _tcp_store
elastic_distributed.dist.TCPStore = _tcp_store

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
