"""The optimizer's parameter groups and their learning-rate schedule.

The projection a ColBERT adds on a base that is not one starts random, the encoder does not:
``training.head_learning_rate`` gives it a rate of its own (sentence-transformers' ``learning_rate_mapping``).
The schedule is transformers' (``get_scheduler``), the same for every group.
"""

from __future__ import annotations

import torch
from transformers import get_scheduler

from trainer.config.schema import TrainingConfig

ENCODER_GROUPS = 2  # groups 0 and 1: the encoder's matrices (weight decay) and the rest (none); 2 on: the head


def param_groups(model: torch.nn.Module, tcfg: TrainingConfig) -> list[dict]:
    """The encoder's trainable parameters with weight decay (matrices) and without (biases, LayerNorm
    weights), then the layers after the encoder (the projection: module 1 on) at ``head_learning_rate`` when
    it is set. The groups are this order on every run, so a checkpoint's optimizer state fits them."""
    split_head = tcfg.head_learning_rate is not None
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
        groups.append({"params": head, "weight_decay": tcfg.weight_decay, "lr": tcfg.head_learning_rate})
    return groups


def schedule(
    tcfg: TrainingConfig, optimizer: torch.optim.Optimizer, total_steps: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """``lr_scheduler`` with ``warmup_ratio`` of the steps as warm-up, for every group."""
    return get_scheduler(tcfg.lr_scheduler, optimizer, int(tcfg.warmup_ratio * total_steps), total_steps)
