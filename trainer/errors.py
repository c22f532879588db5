"""Errors the trainer reports as one line, importable without torch (``main`` catches them)."""

from __future__ import annotations

__all__ = ["WeightsDiverged"]


class WeightsDiverged(RuntimeError):
    """Ranks hold different weights: continuing would average gradients of different models."""
