"""Process-group set-up, teardown and the few collectives the trainer uses.

Gradients are averaged by torch's DDP (``grad_sync.py``); this module holds the gather that gives
contrastive losses their cross-rank negatives, and the small collectives for logging, the resume
decision and the weight check.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from collections.abc import Iterator

import torch
import torch.distributed as dist

from trainer.config.schema import ConfigError
from trainer.env import Layout
from trainer.errors import JobVerdict

__all__ = [
    "rank",
    "gather_floats",
    "process_group",
    "device_for",
    "all_gather_with_grad",
    "world_size",
    "barrier",
    "check_same_shape",
    "ShapeMismatch",
    "broadcast_object",
    "gather_objects",
    "mean_and_any",
    "all_gather_no_grad",
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
    """NCCL on GPUs, gloo on CPU; the group is destroyed on every exit path.

    Inside a group that already exists (a job of several rounds, ``trainer/rounds.py``), this is a
    no-op: the outer owner leaves and destroys it."""
    if not layout.distributed or dist.is_initialized():
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
    # Leave together: a rank that tears down while rank 0 (the TCPStore host) still works can
    # abort in its store thread at exit ("terminate called without an active exception", exit -6
    # instead of the error's code). So on success, and on a verdict every rank reached at the same
    # point, all ranks pass one barrier first. A rank-local failure (a dead peer) leaves at once.
    try:
        yield
        dist.barrier()
    except JobVerdict:
        dist.barrier()
        raise
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
    """all_gather whose backward gives this rank the sum over ranks of its slice's gradient.

    One code path for NCCL and gloo (torch >= 2.6's gloo has ``reduce_scatter_tensor``), so the CPU
    tests run exactly what GPUs run. Out of place: the incoming gradient may be shared with another
    consumer in the graph (an addition passes one tensor to both inputs), which must not see a sum.
    ``torch.distributed.nn.all_gather`` goes through all_to_all, which gloo lacks, and returned
    wrong gradients for non-contiguous inputs under gloo.
    """

    @staticmethod
    def forward(ctx, t: torch.Tensor) -> torch.Tensor:
        check_same_shape(t, "all_gather_with_grad")
        ctx.n = t.shape[0]
        return all_gather_no_grad(t)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        out = torch.empty((ctx.n, *grad.shape[1:]), dtype=grad.dtype, device=grad.device)
        dist.reduce_scatter_tensor(out, grad.contiguous())  # SUM: every rank's loss terms
        return out


class ShapeMismatch(ConfigError, JobVerdict):
    """Ranks hand a collective tensors of different shapes (a different config on some pod)."""


def check_same_shape(t: torch.Tensor, what: str) -> None:
    """Every rank raises the same one line when the ranks' shapes differ (instead of a hang or a crash
    deep in the backend). One small all-gather of the shapes."""
    dims = torch.full((8,), -1, dtype=torch.int64, device=t.device)
    dims[: t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
    every = torch.empty(dist.get_world_size() * 8, dtype=torch.int64, device=t.device)
    dist.all_gather_into_tensor(every, dims)
    shapes = [tuple(int(d) for d in row if d >= 0) for row in every.view(-1, 8).tolist()]
    if len(set(shapes)) > 1:
        listed = ", ".join(f"rank {r} {s}" for r, s in enumerate(shapes))
        raise ShapeMismatch(
            f"{what}: ranks hold tensors of different shapes ({listed}); every pod must run the same "
            "config (model lengths, batch size)"
        )


def all_gather_with_grad(t: torch.Tensor) -> torch.Tensor:
    """Concatenate ``t`` from every rank along dim 0, keeping the autograd graph.

    The backward sums each slice's gradient over ranks, so the gradient reaching this rank's ``t``
    already holds every rank's loss term. Losses therefore take a plain local mean (no
    ``* world_size``, PyLate's error), and the gradient average (DDP) divides by W once.
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


def mean_and_any(value: torch.Tensor, flag: bool, device: torch.device) -> tuple[torch.Tensor, bool]:
    """The global mean of a per-rank scalar tensor and whether any rank raised ``flag``, in one all-reduce.

    The loop calls this once a step anyway (for the loss), so a stop request on one pod reaches
    every rank at the same step without an extra collective. The mean stays on the device (float64);
    the flag is read back: the step's one host sync for it."""
    if not _active():
        return value, flag
    raised = torch.tensor(float(flag), dtype=torch.float64, device=device)
    t = torch.stack([value.to(device=device, dtype=torch.float64), raised])
    dist.all_reduce(t)
    return t[0] / dist.get_world_size(), bool(t[1].item() > 0)


def sum_across(t: torch.Tensor) -> torch.Tensor:
    """The sum of a tensor over every rank (a copy; the input is left as it is)."""
    t = t.clone()
    if _active():
        dist.all_reduce(t)
    return t


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


def barrier() -> None:
    if _active():
        dist.barrier()
