"""TrainStates small enough to build in a test: around a linear model, for steps, checkpoints and resume."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from trainer.config.load import parse_config
from trainer.run.state import TrainState


def linear_state(model: torch.nn.Module | None = None, **fields) -> TrainState:
    """A TrainState around ``model`` (default: a 3-to-1 linear layer): AdamW at 0.1, a constant schedule, no loss
    scaling, no autocast; ``fields`` set the rest (``cfg``, ``loss_fn``, ``total_steps``, ``step``...)."""
    model = model if model is not None else torch.nn.Linear(3, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    defaults = {
        "model": model,
        "forward": model,
        "params": list(model.parameters()),
        "optimizer": optimizer,
        "scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
        "scaler": torch.amp.GradScaler("cpu", enabled=False),
        "autocast": contextlib.nullcontext,
        "data": None,
        "loss_fn": None,
        "total_steps": 1,
    }
    return TrainState(**(defaults | fields))


def tiny_state(tmp_path: Path) -> TrainState:
    """A TrainState of a linear model after one step, with a config: what resume.capture reads."""
    cfg = parse_config(
        {"data": {"train": {"path": "t"}}, "training": {"max_steps": 4}, "output_dir": str(tmp_path / "out")}
    )
    t = linear_state(cfg=cfg, total_steps=4, data_identity="rows-1")
    t.model(torch.ones(1, 3)).sum().backward()
    t.optimizer.step()
    t.step, t.metrics, t.skipped_nonfinite = 1, {"before": {"ndcg@10": 0.5}}, 1
    return t
