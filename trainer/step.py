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
from trainer.state import TrainState

log = logging.getLogger("trainer")

__all__ = ["accumulate_gradients", "apply_update", "optimizer_step"]


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


def optimizer_step(t: TrainState, feed: Iterator) -> tuple[torch.Tensor, float]:
    """One whole step: (local loss on the device, global gradient norm)."""
    local_loss = accumulate_gradients(t, feed)
    return local_loss, apply_update(t)
