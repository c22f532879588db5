"""Gradient averaging across ranks: torch's ``DistributedDataParallel``, set up for ColBERT training.

DDP gives what a hand-written reducer has to re-prove: buckets all-reduced in index order on every
rank (a parameter used on some ranks and not others is still summed with the right partner),
buckets rebuilt in the order gradients become ready (overlap with backward from the first layers
backward reaches), globally unused parameters left at ``None`` (so AdamW does not decay what one
process would leave alone) when ``distributed.find_unused_parameters`` is on, and ``no_sync()`` for
micro-batches whose gradients only accumulate.

How the loop uses it:

- every forward whose gradient must reach the weights goes through the wrapper (:func:`wrap`);
- every backward but the step's last runs under :func:`deferred` (accumulation micro-batches,
  GradCache's replays), so gradients accumulate locally and are all-reduced once;
- ``broadcast_buffers`` is off: BERT's buffers (position and token-type ids) never change, and a
  broadcast before every forward would be one collective per forward for nothing.
"""

from __future__ import annotations

import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel

from trainer import distributed as D

__all__ = ["wrap", "unwrap", "deferred"]


def wrap(model: torch.nn.Module, device: torch.device, find_unused_parameters: bool = False) -> torch.nn.Module:
    """``model`` under DDP when there is more than one rank (DDP also broadcasts rank 0's weights), else as is."""
    if D.world_size() == 1:
        return model
    return DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        broadcast_buffers=False,
        gradient_as_bucket_view=True,  # gradients live in the buckets: no copy in, no copy out
        find_unused_parameters=find_unused_parameters,
    )


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The model itself (attributes such as ``skiplist`` live there, not on the DDP wrapper)."""
    return module.module if isinstance(module, DistributedDataParallel) else module


def deferred(module: torch.nn.Module, defer: bool = True) -> contextlib.AbstractContextManager:
    """Backward passes inside accumulate gradients without all-reducing them (``no_sync``)."""
    if defer and isinstance(module, DistributedDataParallel):
        return module.no_sync()
    return contextlib.nullcontext()
