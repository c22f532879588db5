"""One optimizer step, and the state it updates.

A step is ``accumulation`` micro-batches of forward and backward (every backward but the last under
DDP's ``no_sync``, so gradients are all-reduced once, overlapped with the last backward), then
unscale, clip, update, schedule. The training loop (``train.py``) and the gradient-equivalence tests
call these same functions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.errors import NonFinite
from trainer.grad_sync import deferred

log = logging.getLogger("trainer")

__all__ = ["TrainState", "accumulate_gradients", "apply_update", "optimizer_step"]


@dataclass(kw_only=True)
class TrainState:
    """Everything the loop reads and updates; built once by keyword in ``train.build``."""

    model: torch.nn.Module  # the ColBERT model itself: evaluation, saving, checkpoints
    forward: torch.nn.Module  # what losses call: the model under DDP when there are several ranks
    params: list[torch.nn.Parameter]  # trainable, in model order (clipping)
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    autocast: Callable[[], Any]
    data: Any  # the batch schedule (data/batches.py)
    loss_fn: Callable
    total_steps: int
    accumulation: int = 1
    max_grad_norm: float | None = None
    step: int = 0
    rng: dict | None = None  # a checkpoint's RNG streams, set as the last thing before the next step
    metrics: dict = field(default_factory=dict)
    step_times: list[float] = field(default_factory=list)  # perf_counter at the end of each step of this run
    progress: Any = None  # rank 0's Progress (progress.py), set once the resumed step is known
    skip_nonfinite: int = 0  # training.skip_nonfinite_steps: non-finite steps to skip before stopping
    skipped_nonfinite: int = 0  # skipped so far by the job (carried in checkpoints)
    data_identity: str | None = None  # Rows.identity() of the rows trained on (checked on resume)


def accumulate_gradients(t: TrainState, feed: Iterator) -> float:
    """Forward and backward over the step's micro-batches; returns the local loss (their mean).

    Gradients are all-reduced (averaged) during the last backward only. Each micro-batch's loss is
    its own mean, hence the ``1/A``. GradCache's replays are backward passes too: all but the very
    last accumulate without a sync."""
    local_loss = 0.0
    for micro in range(t.accumulation):
        last = micro == t.accumulation - 1
        with deferred(t.forward, defer=not last), t.autocast():
            out = t.loss_fn(t.forward, next(feed))
            t.scaler.scale(out.loss / t.accumulation).backward()  # one path for fp32, bf16 and fp16
            if out.replay is not None:  # GradCache: the cached gradients go through the encoder now
                out.replay(lambda: deferred(t.forward))
        local_loss += float(out.loss.detach()) / t.accumulation
    return local_loss


def apply_update(t: TrainState) -> float:
    """Unscale, clip on the global gradient, step the optimizer and schedule; returns the gradient norm."""
    if t.scaler.is_enabled():
        t.scaler.unscale_(t.optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(t.params, t.max_grad_norm or float("inf"))
    if not t.scaler.is_enabled() and not torch.isfinite(grad_norm):  # fp16's scaler skips such steps itself
        t.optimizer.zero_grad(set_to_none=True)  # nothing of this step reaches the weights
        if t.skipped_nonfinite >= t.skip_nonfinite:
            raise NonFinite(
                f"step {t.step + 1}: the gradient is not finite (norm {float(grad_norm)}): a NaN or infinite loss; "
                "the weights were not updated and nothing was saved from it. Check the rows of this step "
                "(teacher scores), lower training.learning_rate, or allow a few with training.skip_nonfinite_steps"
            )
        t.skipped_nonfinite += 1
        log.warning("step %d: non-finite gradient (norm %s), skipped (%d of training.skip_nonfinite_steps %d)",
                    t.step + 1, float(grad_norm), t.skipped_nonfinite, t.skip_nonfinite)  # fmt: skip
        t.scheduler.step()
        t.step += 1
        return float(grad_norm)
    t.scaler.step(t.optimizer)
    t.scaler.update()
    t.scheduler.step()
    t.optimizer.zero_grad(set_to_none=True)
    t.step += 1
    return float(grad_norm)


def optimizer_step(t: TrainState, feed: Iterator) -> tuple[float, float]:
    """One whole step: (local loss, global gradient norm)."""
    local_loss = accumulate_gradients(t, feed)
    return local_loss, apply_update(t)
