"""The optimizer's parameter groups and their learning-rate schedule.

Two levers live here, both about the projection a ColBERT adds on a base that is not one: it starts random,
the encoder does not.

* ``training.head_learning_rate``: the projection at its own rate (sentence-transformers'
  ``learning_rate_mapping``).
* ``training.head_only_steps``: the first N steps train the projection alone, then the encoder joins with its
  own warm-up (LP-FT, Kumar et al. 2022, "Fine-Tuning can Distort Pretrained Features": a random head's
  gradients pull a trained encoder away from what it knew before the head has learnt anything).

The schedules themselves are transformers' (``get_scheduler``); with ``head_only_steps`` the encoder's groups
follow the same schedule over the steps left after the head-only start, shifted to begin there.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import get_scheduler

from trainer.config.schema import ConfigError, TrainingConfig

ENCODER_GROUPS = 2  # groups 0 and 1: the encoder's matrices (weight decay) and the rest (none); 2 on: the head


def param_groups(model: torch.nn.Module, tcfg: TrainingConfig) -> list[dict]:
    """The encoder's trainable parameters with weight decay (matrices) and without (biases, LayerNorm
    weights), then the layers after the encoder (the projection: module 1 on) at ``head_learning_rate``
    (default ``learning_rate``) when either head lever is set. The groups are this order on every run, so a
    checkpoint's optimizer state fits them."""
    split_head = tcfg.head_learning_rate is not None or tcfg.head_only_steps > 0
    decay, no_decay, head = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if split_head and not name.startswith("0."):
            head.append(p)
        else:
            (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    groups = [{"params": decay, "weight_decay": tcfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if head:
        lr = tcfg.head_learning_rate or tcfg.learning_rate
        groups.append({"params": head, "weight_decay": tcfg.weight_decay, "lr": lr})
    return groups


def after_head_only(schedule: Callable[[int], float], start: int) -> Callable[[int], float]:
    """An encoder group's multiplier: 0 for the first ``start`` steps, then ``schedule`` from its step 0.

    A plain function on purpose: ``LambdaLR`` saves and restores the attributes of a callable object, so an
    object would bring the checkpoint's step count back over a resumed run's own (another ``max_steps``).

    >>> after = after_head_only(lambda step: min(1.0, (step + 1) / 2), start=3)
    >>> [after(step) for step in range(6)]
    [0.0, 0.0, 0.0, 0.5, 1.0, 1.0]
    """

    def multiplier(step: int) -> float:
        return 0.0 if step < start else schedule(step - start)

    return multiplier


def schedule(
    tcfg: TrainingConfig, optimizer: torch.optim.Optimizer, total_steps: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """``lr_scheduler`` with ``warmup_ratio`` of the steps as warm-up; with ``head_only_steps`` the encoder's
    groups wait that many steps, then warm up over ``warmup_ratio`` of the steps left."""
    start = tcfg.head_only_steps
    if start == 0:
        return get_scheduler(tcfg.lr_scheduler, optimizer, int(tcfg.warmup_ratio * total_steps), total_steps)
    if start >= total_steps:
        raise ConfigError(
            f"training.head_only_steps {start} leaves no step for the encoder (the run has {total_steps}): "
            "lower it, or raise training.max_steps"
        )
    head = _multiplier(tcfg, total_steps)
    encoder = after_head_only(_multiplier(tcfg, total_steps - start), start)
    lambdas = [encoder] * ENCODER_GROUPS + [head] * (len(optimizer.param_groups) - ENCODER_GROUPS)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambdas)


def _multiplier(tcfg: TrainingConfig, steps: int):
    """transformers' multiplier for ``steps`` steps (built on a throwaway optimizer: ``get_scheduler`` sets the
    learning rates of the optimizer it is given)."""
    scratch = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    return get_scheduler(tcfg.lr_scheduler, scratch, int(tcfg.warmup_ratio * steps), steps).lr_lambdas[0]
