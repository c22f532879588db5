"""Losses whose gradient does not depend on how the global batch is split across ranks.

Each takes a ``Batch`` and the model, runs forward *and* backward (the cached loss must own its
backward), and returns the detached local loss. One loss per file, each testable on its own.
"""

from trainer.losses.cached_contrastive import CachedContrastive
from trainer.losses.contrastive import Contrastive, contrastive_from_embeddings
from trainer.losses.distillation import Distillation, distillation_from_scores

__all__ = [
    "Contrastive",
    "CachedContrastive",
    "Distillation",
    "contrastive_from_embeddings",
    "distillation_from_scores",
    "build_loss",
]


def build_loss(cfg, gather: bool):
    """The loss object for a ``TrainConfig.loss`` section."""
    if cfg.name == "contrastive":
        return Contrastive(temperature=cfg.temperature, gather=gather)
    if cfg.name == "cached-contrastive":
        return CachedContrastive(temperature=cfg.temperature, gather=gather, mini_batch_size=cfg.mini_batch_size)
    return Distillation(normalize_scores=cfg.normalize_scores)
