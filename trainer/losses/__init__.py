"""Losses: every objective this project trains with, by one key (``loss.name``).

This module is light (no torch): the config's ``loss`` choices, the chart's schema, the one-line refusal of an
unknown name and "does this loss read teacher scores?" all read :data:`LOSSES`. Each entry is a config section
(:class:`~trainer.losses.loss.Loss`) that says what it reads (``scored``) and builds its objective, importing
the torch module that computes it only then:

==================  ======  ===========================================================================
key                 reads   objective
==================  ======  ===========================================================================
contrastive         pairs   in-batch cross-entropy over MaxSim, negatives from every rank (``contrastive.py``)
cached-contrastive  pairs   the same through GradCache: any batch in bounded memory (``cached_contrastive.py``)
distillation        scores  KL to a teacher's scores over each query's candidates (``distillation.py``)
==================  ======  ===========================================================================

Every objective takes the model and a ``Batch`` and returns a ``LossOutput`` (``base.py``) whose gradient does
not depend on how the global batch is split across ranks. A new loss is one module (its section, and the
objective it builds) and one entry here.

>>> {'contrastive', 'cached-contrastive', 'distillation'} <= set(LOSSES)  # a new loss adds to these
True
>>> LOSSES['distillation'].scored, LOSSES['contrastive'].scored
(True, False)
>>> loss_named("focal")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: unknown loss 'focal': use one of contrastive, cached-contrastive, distillation...
"""

from __future__ import annotations

from typing import Any

from trainer.losses.loss import Loss, Objective
from trainer.losses.sections import CachedContrastiveLoss, ContrastiveLoss, DistillationLoss

__all__ = [
    "LOSSES",
    "Loss",
    "LossOutput",
    "Contrastive",
    "CachedContrastive",
    "Distillation",
    "build_loss",
    "contrastive_from_embeddings",
    "distillation_from_scores",
    "loss_named",
]

LOSSES: dict[str, type[Loss]] = {c.key(): c for c in (ContrastiveLoss, CachedContrastiveLoss, DistillationLoss)}
"""By ``loss.name``, in the order the config's schema lists them."""


def loss_named(name: str) -> type[Loss]:
    """The section of loss ``name``; an unknown name is refused in one line, never read as another loss."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}: use one of {', '.join(LOSSES)}")
    return LOSSES[name]


def build_loss(cfg: Loss, gather: bool) -> Objective:
    """The objective of a ``TrainConfig.loss`` section; a name the registry does not hold is refused."""
    loss_named(cfg.name)
    return cfg.build(gather)


# The torch objects, for callers that compute a loss directly: loaded on first use, so this module stays light.
_LAZY = {
    "LossOutput": "base",
    "Contrastive": "contrastive",
    "contrastive_from_embeddings": "contrastive",
    "CachedContrastive": "cached_contrastive",
    "Distillation": "distillation",
    "distillation_from_scores": "distillation",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
