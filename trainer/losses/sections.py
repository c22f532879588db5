"""The config sections of the losses this project ships (:class:`trainer.losses.loss.Loss`), torch-free; each
names the objective its own module computes (``contrastive.py``, ``cached_contrastive.py``, ``distillation.py``)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from trainer.losses.loss import Loss

__all__ = ["CachedContrastiveLoss", "ContrastiveLoss", "DistillationLoss"]


class ContrastiveLoss(Loss):
    name: Literal["contrastive"] = "contrastive"
    temperature: float = Field(1.0, gt=0, description="Scores are divided by this before the softmax.")
    mask_labelled_positives: bool = Field(
        False,
        description="Leave out of each query's in-batch negatives every document data.train labels relevant to "
        "it (another row's positive of the same query, or of a query with the same text): on data with many "
        "positives per query these are not negatives (trainer/data/labelled.py).",
    )
    objective: ClassVar[str] = "contrastive:Contrastive"

    def arguments(self, gather: bool, labelled: frozenset | None) -> dict[str, Any]:
        return {"temperature": self.temperature, "gather": gather, "labelled": labelled}


class CachedContrastiveLoss(Loss):
    name: Literal["cached-contrastive"]
    temperature: float = Field(1.0, gt=0)
    mini_batch_size: int = Field(8, ge=1, description="Texts encoded at once; bounds activation memory.")
    objective: ClassVar[str] = "cached_contrastive:CachedContrastive"

    def arguments(self, gather: bool, labelled: frozenset | None) -> dict[str, Any]:
        return {"temperature": self.temperature, "gather": gather, "mini_batch_size": self.mini_batch_size}


class DistillationLoss(Loss):
    name: Literal["distillation"]
    normalize_scores: bool = Field(True, description="Teacher scores are softmax-normalised before KL.")
    scored: ClassVar[bool] = True
    objective: ClassVar[str] = "distillation:Distillation"

    def arguments(self, gather: bool, labelled: frozenset | None) -> dict[str, Any]:
        return {"normalize_scores": self.normalize_scores}
