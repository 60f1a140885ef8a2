"""The flat-tensor collectives under their current names, and the Work of an asynchronous one.

torch 2.13 renamed ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` to
``all_gather_single`` and ``reduce_scatter_single``; the old names are wrappers that call the new
ones (the same process-group call, so the same trace) after a FutureWarning on every call, which
filled the rank logs. Older torch (>= 2.4, pyproject) has only the old names, without the warning.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def started(work: dist.Work | None) -> dist.Work:
    """The Work of a call launched with ``async_op=True`` (isend, irecv: always one; torch
    types it Optional, for the synchronous form)."""
    if work is None:
        raise RuntimeError("an asynchronous collective returned no Work")
    return work


def wait(work: dist.Work | None, what: str) -> None:
    """Block until WORK is done; None: waited for before it was launched (a bug, said so)."""
    if work is None:
        raise RuntimeError(f"{what}: waited for before it was launched")
    work.wait()


def grad_of(p: torch.Tensor) -> torch.Tensor:
    """P's gradient; every parameter the strategies train gets one in each backward."""
    if p.grad is None:
        raise RuntimeError("a parameter got no gradient in backward")
    return p.grad
