"""Process-group set-up, teardown and the few collectives the trainer uses.

Gradients are averaged by explicit bucketed all-reduces (``grad_sync.py``, overlapped with the last
backward) rather than through DDP: DDP's ``find_unused_parameters=False`` silently mis-averaged
ColBERT's gradients (the pooler never gets one), and ``True`` costs a graph traversal per step. The
explicit reducer issues the same collectives on every rank by construction, and the
gradient-equivalence test proves the result.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from collections.abc import Iterator

import torch
import torch.distributed as dist

from trainer.env import Layout

__all__ = [
    "rank",
    "gather_floats",
    "process_group",
    "device_for",
    "all_gather_with_grad",
    "mean_across",
    "broadcast_parameters",
    "broadcast_object",
    "gather_objects",
    "mean_and_any",
]

log = logging.getLogger(__name__)


def device_for(layout: Layout) -> torch.device:
    """Pin the device by LOCAL_RANK (never rank % device_count: nodes may differ in GPU count)."""
    if torch.cuda.is_available():
        torch.cuda.set_device(layout.local_rank)
        return torch.device("cuda", layout.local_rank)
    return torch.device("cpu")


@contextlib.contextmanager
def process_group(layout: Layout, timeout_s: int) -> Iterator[None]:
    """NCCL on GPUs, gloo on CPU; the group is destroyed on every exit path."""
    if not layout.distributed:
        yield
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    os.environ.setdefault("MASTER_ADDR", layout.master_addr or "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(layout.master_port or 29500))
    kwargs = {}
    if backend == "nccl":
        kwargs["device_id"] = torch.device("cuda", layout.local_rank)
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        rank=layout.rank,
        world_size=layout.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        **kwargs,
    )
    try:
        yield
        # Leave together: a rank that tears down while rank 0 (the TCPStore host) still works can
        # abort in its store thread at exit ("terminate called without an active exception").
        dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    """The number of ranks, 1 without a process group."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """This process's rank, 0 without a process group."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class _GatherWithGrad(torch.autograd.Function):
    """all_gather whose backward sums every rank's gradient for this rank's slice.

    ``torch.distributed.nn.all_gather`` does the same through all_to_all, but under gloo it
    returned wrong gradients here when the incoming gradient was non-contiguous (einsum's backward
    produces permuted strides). A contiguous all_reduce and a slice is simple and always right.
    """

    @staticmethod
    def forward(ctx, t: torch.Tensor) -> torch.Tensor:
        ctx.rank, ctx.n = dist.get_rank(), t.shape[0]
        return all_gather_no_grad(t)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous()
        if dist.get_backend() == "nccl":  # each rank needs only its slice of the sum: a reduce-scatter
            out = torch.empty((ctx.n, *grad.shape[1:]), dtype=grad.dtype, device=grad.device)
            dist.reduce_scatter_tensor(out, grad)
            return out
        dist.all_reduce(grad)  # SUM (gloo has no reduce-scatter of tensors): every rank's loss terms
        return grad[ctx.rank * ctx.n : (ctx.rank + 1) * ctx.n]


def all_gather_with_grad(t: torch.Tensor) -> torch.Tensor:
    """Concatenate ``t`` from every rank along dim 0, keeping the autograd graph.

    The backward sums each slice's gradient over ranks, so the gradient reaching this rank's ``t``
    already holds every rank's loss term. Losses therefore take a plain local mean (no
    ``* world_size``, PyLate's error), and the gradient average (``grad_sync.py``) divides by W once.
    """
    if not _active():
        return t
    return _GatherWithGrad.apply(t)


def all_gather_no_grad(t: torch.Tensor) -> torch.Tensor:
    if not _active():
        return t
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim=0)


def mean_across(value: float, device: torch.device) -> float:
    """The mean of a per-rank scalar over all ranks (for logging the global-batch loss)."""
    return mean_and_any(value, False, device)[0]


def mean_and_any(value: float, flag: bool, device: torch.device) -> tuple[float, bool]:
    """The global mean of a per-rank scalar and whether any rank raised ``flag``, in one all-reduce.

    The loop calls this once a step anyway (for the loss), so a stop request on one pod reaches
    every rank at the same step without an extra collective."""
    if not _active():
        return value, flag
    t = torch.tensor([value, float(flag)], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t[0].item() / dist.get_world_size()), bool(t[1].item() > 0)


def broadcast_object(obj):
    """Rank 0's ``obj`` on every rank (pickled; tensors inside come back on the CPU)."""
    if not _active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj) -> list:
    """Every rank's ``obj``, in rank order, on every rank."""
    if not _active():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_floats(value: float, device: torch.device) -> list[float]:
    """One float from every rank, in rank order (peak memory per process, for metrics.json)."""
    if not _active():
        return [value]
    t = torch.zeros(dist.get_world_size(), dtype=torch.float64, device=device)
    t[dist.get_rank()] = value
    dist.all_reduce(t)
    return t.tolist()


def broadcast_parameters(module: torch.nn.Module) -> None:
    """Make every rank start from rank 0's weights (new projection layers are randomly initialised)."""
    if not _active():
        return
    for t in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(t.data, src=0)


def barrier() -> None:
    if _active():
        dist.barrier()
