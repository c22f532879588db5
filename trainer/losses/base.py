"""What every loss returns to the training loop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["LossOutput"]


@dataclass
class LossOutput:
    loss: torch.Tensor  # the local mean loss, with its graph: the loop calls backward on it
    # GradCache: run after that backward, under the same autocast; its argument makes a context in which
    # a backward only accumulates gradients (DDP's no_sync), used for every replay but the last
    replay: Callable[..., None] | None = None
    # (sum of margins, easy rows, rows) on the device, no graph (losses/hardness.py); None where not measured
    hardness: torch.Tensor | None = None
