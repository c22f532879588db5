"""The run's state: one object that every phase of ``trainer/train.py`` takes alone.

Built once, by keyword, in ``train.build``; the phases (resume, evaluate, loop, checkpoint, finish) and
``resume.capture``/``restore`` read and update it, so a phase's signature is ``(t)`` and a new piece of
state is one field here instead of another argument threaded through nine functions. What a checkpoint
holds of it is listed in ``trainer/run/checkpoint.py`` (``CHECKPOINT_FORMAT``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trainer.config.schema import TrainConfig
from trainer.data.batches import StreamingData, TokenizedData
from trainer.env import Layout
from trainer.evaluate import BeirSplit
from trainer.losses.base import LossOutput
from trainer.reporting.progress import Progress
from trainer.reporting.tracking import Tracker
from trainer.run.preemption import StopRequest

__all__ = ["TrainState"]


@dataclass(kw_only=True)
class TrainState:
    """Everything the run reads and updates. The step functions (``step.py``) need only the training
    objects, so the run's settings have defaults: a test drives one step without a config."""

    # the run: settings, where this process sits, what it writes to
    cfg: TrainConfig | None = None
    layout: Layout = field(default_factory=Layout)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    tracker: Tracker | None = None  # rank 0's sinks (trainer/reporting/tracking.py), entered and closed by train.run
    stop: StopRequest | None = None  # the job's SIGTERM flag (trainer/run/preemption.py), checked once a step
    progress: Progress | None = None  # rank 0's progress reports, set once the resumed step is known
    split: BeirSplit | None = None  # the held-out BEIR split evaluated on (None: no data.eval_beir)
    metrics_file: str | None = None  # colbert-train --metrics-file: rank 0 appends each periodic evaluation
    # the training objects
    model: torch.nn.Module  # the ColBERT model itself: evaluation, saving, checkpoints
    forward: torch.nn.Module  # what losses call: the model under DDP when there are several ranks
    params: list[torch.nn.Parameter]  # trainable, in model order (clipping)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    autocast: Callable[[], AbstractContextManager[object]]  # a fresh autocast (or null) context per forward
    data: StreamingData | TokenizedData  # the batch schedule: batches are a pure function of (seed, step)
    loss_fn: Callable[..., LossOutput]  # (model, batch) -> the loss (losses/)
    total_steps: int
    accumulation: int = 1
    max_grad_norm: float | None = None
    skip_nonfinite: int = 0  # training.skip_nonfinite_steps: non-finite steps to skip before stopping
    data_identity: str | None = None  # Rows.identity() of the rows trained on (checked on resume)
    data_sampled: str | None = None  # Rows.sampled_identity(): checks a checkpoint 0.3 wrote, as 0.3 did
    # progress, carried in checkpoints where it says so
    step: int = 0
    rng: dict | None = None  # a checkpoint's RNG streams, set as the last thing before the next step
    loss: torch.Tensor | None = None  # the last step's global loss, on the device: read back at log steps
    hardness: torch.Tensor | None = None  # this rank's hardness sums since the last log step (losses/hardness.py)
    metrics: dict = field(default_factory=dict)  # in checkpoints: e.g. the evaluation before training
    step_times: list[float] = field(default_factory=list)  # perf_counter at the end of each step of this run
    skipped_nonfinite: int = 0  # skipped so far by the job (in checkpoints: the budget is per job)

    @property
    def out_dir(self) -> Path:
        return Path(self.cfg.output_dir)

    @property
    def ckpt_dir(self) -> Path:
        return self.out_dir / "checkpoints"
