"""One optimizer step.

A step is ``accumulation`` micro-batches of forward and backward (every backward but the last under
DDP's ``no_sync``, so gradients are all-reduced once, overlapped with the last backward), then
unscale, clip, update, schedule. The training loop (``train.py``) and the gradient-equivalence tests
call these same functions.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import torch

from trainer.errors import NonFinite
from trainer.grad_sync import deferred
from trainer.run.state import TrainState

log = logging.getLogger("trainer")

__all__ = ["MIN_LOSS_SCALE", "accumulate_gradients", "apply_update", "optimizer_step"]

# fp16's loss scale below which a skipped step stops the job: DeepSpeed's ``min_loss_scale`` default. Below 1
# the scaler shrinks gradients, which no finite fp16 loss needs; from GradScaler's 65536 it takes 17 skips
# in a row (more with good steps between: the scale grows back only after 2000 good steps in a row).
MIN_LOSS_SCALE = 1.0


def accumulate_gradients(t: TrainState, feed: Iterator) -> torch.Tensor:
    """Forward and backward over the step's micro-batches; returns the local loss (their mean), a float64
    scalar on the device: reading it back is a host sync, which the loop does at log steps only.

    Gradients are all-reduced (averaged) during the last backward only. Each micro-batch's loss is
    its own mean, hence the ``1/A``. GradCache's replays are backward passes too: all but the very
    last accumulate without a sync."""
    local_loss = torch.zeros((), dtype=torch.float64, device=t.device)
    for micro in range(t.accumulation):
        last = micro == t.accumulation - 1
        with deferred(t.forward, defer=not last), t.autocast():
            out = t.loss_fn(t.forward, next(feed))
            t.scaler.scale(out.loss / t.accumulation).backward()  # one path for fp32, bf16 and fp16
            if out.replay is not None:  # GradCache: the cached gradients go through the encoder now
                out.replay(lambda: deferred(t.forward))
        local_loss += out.loss.detach().double() / t.accumulation  # float64, as the host sum was
        if out.hardness is not None:  # summed on the device until a log step reads it
            t.hardness = out.hardness if t.hardness is None else t.hardness + out.hardness
    return local_loss


def apply_update(t: TrainState) -> float:
    """Unscale, clip on the global gradient, step the optimizer and schedule; returns the gradient norm.

    A non-finite gradient is never applied: without a scaler the step is skipped within
    ``training.skip_nonfinite_steps`` (:func:`_skip_nonfinite`); under fp16's GradScaler the scaler skips it
    and halves its scale, and :func:`_scaler_skipped` counts, logs and bounds those skips."""
    if t.scaler.is_enabled():
        t.scaler.unscale_(t.optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(t.params, t.max_grad_norm or float("inf"))
    if not t.scaler.is_enabled() and not torch.isfinite(grad_norm):
        return _skip_nonfinite(t, grad_norm)
    scale = t.scaler.get_scale() if t.scaler.is_enabled() else None
    t.scaler.step(t.optimizer)
    t.scaler.update()
    if scale is not None and t.scaler.get_scale() < scale:  # the scaler skipped this step (as accelerate tells)
        _scaler_skipped(t, grad_norm, scale)
    t.scheduler.step()
    t.optimizer.zero_grad(set_to_none=True)
    t.step += 1
    return float(grad_norm)


def _skip_nonfinite(t: TrainState, grad_norm: torch.Tensor) -> float:
    """fp32 and bf16: drop the step's gradient, count it against ``training.skip_nonfinite_steps``, or stop."""
    t.optimizer.zero_grad(set_to_none=True)  # nothing of this step reaches the weights
    if t.skipped_nonfinite >= t.skip_nonfinite:
        raise NonFinite(
            f"step {t.step + 1}: the gradient is not finite (norm {float(grad_norm)}): a NaN or infinite loss; "
            "the weights were not updated and nothing was saved from it. Check the rows of this step "
            "(teacher scores), lower training.learning_rate, or allow a few with training.skip_nonfinite_steps"
        )
    t.skipped_nonfinite += 1
    log.warning(
        "step %d: non-finite gradient (norm %s), skipped (%d of training.skip_nonfinite_steps %d)",
        t.step + 1,
        float(grad_norm),
        t.skipped_nonfinite,
        t.skip_nonfinite,
    )
    t.scheduler.step()
    t.step += 1
    return float(grad_norm)


def _scaler_skipped(t: TrainState, grad_norm: torch.Tensor, scale: float) -> None:
    """fp16: GradScaler found an inf or NaN gradient, skipped the optimizer step and halved its scale.

    A few such steps while the scale settles are how fp16 works; a NaN loss makes one at every step, and the
    scale then falls without end while the weights never move. So each is logged and counted in
    ``metrics["scaler_skipped_steps"]`` (checkpointed with the metrics: the count is per job), and the job
    stops once the scale falls below :data:`MIN_LOSS_SCALE`. Every rank sees the same all-reduced gradient,
    hence the same scale: they stop together."""
    now = t.scaler.get_scale()
    skipped = t.metrics["scaler_skipped_steps"] = t.metrics.get("scaler_skipped_steps", 0) + 1
    if now < MIN_LOSS_SCALE:
        raise NonFinite(
            f"step {t.step + 1}: the gradient is not finite even at fp16 loss scale {scale:g} (GradScaler "
            f"skipped {skipped} step(s) of this job, the scale is now {now:g}, below {MIN_LOSS_SCALE:g}): a NaN or "
            "infinite loss; the weights were not updated by these steps and nothing was saved from them. Check "
            "the rows of this step (teacher scores), lower training.learning_rate, or use training.precision bf16"
        )
    log.warning(
        "step %d: fp16 gradient not finite at loss scale %g: GradScaler skipped the update, scale now %g "
        "(%d skipped so far; the job stops below %g)",
        t.step + 1,
        scale,
        now,
        skipped,
        MIN_LOSS_SCALE,
    )


def optimizer_step(t: TrainState, feed: Iterator) -> tuple[torch.Tensor, float]:
    """One whole step: (local loss on the device, global gradient norm)."""
    local_loss = accumulate_gradients(t, feed)
    return local_loss, apply_update(t)
