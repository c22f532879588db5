"""Losses whose gradient does not depend on how the global batch is split across ranks.

Each takes the model and a ``Batch`` and returns a :class:`LossOutput`: the local loss (the mean over
this rank's queries) for the training loop to backpropagate, plainly or through fp16's GradScaler,
one code path for every precision, and, for GradCache, a ``replay`` hook the loop calls right after
that backward to push the cached embedding gradients through the encoder. One loss per file, each
testable on its own.
"""

from trainer.losses.base import LossOutput
from trainer.losses.cached_contrastive import CachedContrastive
from trainer.losses.contrastive import Contrastive, contrastive_from_embeddings
from trainer.losses.distillation import Distillation, distillation_from_scores

__all__ = [
    "LossOutput",
    "Contrastive",
    "CachedContrastive",
    "Distillation",
    "contrastive_from_embeddings",
    "distillation_from_scores",
    "build_loss",
]


def build_loss(cfg, gather: bool, labelled: frozenset | None = None):
    """The loss object for a ``TrainConfig.loss`` section."""
    if cfg.name == "contrastive":
        return Contrastive(temperature=cfg.temperature, gather=gather, labelled=labelled)
    if cfg.name == "cached-contrastive":
        return CachedContrastive(temperature=cfg.temperature, gather=gather, mini_batch_size=cfg.mini_batch_size)
    return Distillation(normalize_scores=cfg.normalize_scores)
