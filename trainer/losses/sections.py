"""The config sections of the losses this project ships (:class:`trainer.losses.loss.Loss`), torch-free; each
names the objective its own module computes (``contrastive.py``, ``cached_contrastive.py``, ``distillation.py``)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from trainer.losses.loss import Loss

__all__ = ["CachedContrastiveLoss", "ContrastiveLoss", "DistillationLoss"]


TEMPERATURE = (
    "Scores are divided by this before the softmax. auto (with mine:): chosen from how complete the labels look "
    "to the mining retriever, 1 where the labelled positive usually ranks first, 0.25 where it usually ranks "
    "below unlabelled relevant documents (trainer/labels.py); the log, mining.json and the card say which."
)


def _check_temperature(loss: Any) -> dict[str, Any]:
    """The loss's arguments need a number: ``auto`` is replaced by the job before training (trainer/rounds.py)."""
    if loss.temperature == "auto":
        raise ValueError("loss.temperature: auto must be resolved from the mined rows' labels.json before training")
    return {"temperature": loss.temperature}


class ContrastiveLoss(Loss):
    name: Literal["contrastive"] = "contrastive"
    temperature: Annotated[float, Field(gt=0)] | Literal["auto"] = Field(1.0, description=TEMPERATURE)
    objective: ClassVar[str] = "contrastive:Contrastive"

    def arguments(self, gather: bool) -> dict[str, Any]:
        return {**_check_temperature(self), "gather": gather}


class CachedContrastiveLoss(Loss):
    name: Literal["cached-contrastive"]
    temperature: Annotated[float, Field(gt=0)] | Literal["auto"] = Field(1.0, description=TEMPERATURE)
    mini_batch_size: int = Field(8, ge=1, description="Texts encoded at once; bounds activation memory.")
    objective: ClassVar[str] = "cached_contrastive:CachedContrastive"

    def arguments(self, gather: bool) -> dict[str, Any]:
        return {**_check_temperature(self), "gather": gather, "mini_batch_size": self.mini_batch_size}


class DistillationLoss(Loss):
    name: Literal["distillation"]
    normalize_scores: bool = Field(True, description="Teacher scores are softmax-normalised before KL.")
    scored: ClassVar[bool] = True
    objective: ClassVar[str] = "distillation:Distillation"

    def arguments(self, gather: bool) -> dict[str, Any]:
        return {"normalize_scores": self.normalize_scores}
