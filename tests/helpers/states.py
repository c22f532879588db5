"""A TrainState small enough to build in a test (a linear model after one step), for checkpoint and resume."""

from __future__ import annotations

from pathlib import Path

import torch

from trainer.config.load import parse_config
from trainer.run.state import TrainState


def tiny_state(tmp_path: Path) -> TrainState:
    """A TrainState of a linear model after one step, with a config: what resume.capture reads."""

    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    cfg = parse_config(
        {"data": {"train": {"path": "t"}}, "training": {"max_steps": 4}, "output_dir": str(tmp_path / "out")}
    )
    t = TrainState(
        cfg=cfg,
        model=model,
        forward=model,
        params=list(model.parameters()),
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        autocast=None,
        data=None,
        loss_fn=None,
        total_steps=4,
        data_identity="rows-1",
    )
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    t.step, t.metrics, t.skipped_nonfinite = 1, {"before": {"ndcg@10": 0.5}}, 1
    return t
