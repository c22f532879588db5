"""Knowledge distillation: match the student's MaxSim scores to a teacher's over each query's candidates."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pylate.scores import colbert_kd_scores

from trainer.encode import encode_batch
from trainer.losses.base import LossOutput

__all__ = ["Distillation", "distillation_from_scores"]


def distillation_from_scores(student: torch.Tensor, teacher: torch.Tensor, normalize: bool = True) -> torch.Tensor:
    """KL(teacher || student) per query, averaged over this rank's queries.

    ``student`` and ``teacher`` are ``(b, n_docs)``. No documents cross ranks here, so the gradient
    all-reduce's mean over equal per-rank batches is already the global-batch mean.
    """
    target = F.log_softmax(teacher.float(), dim=-1) if normalize else torch.log(teacher.float().clamp_min(1e-12))
    return F.kl_div(F.log_softmax(student.float(), dim=-1), target, reduction="batchmean", log_target=True)


class Distillation:
    def __init__(self, normalize_scores: bool = True):
        self.normalize_scores = normalize_scores

    def __call__(self, model, batch) -> LossOutput:
        queries, docs, mask = encode_batch(model, batch)  # docs: (b, n_docs, tokens, dim)
        student = colbert_kd_scores(queries, docs, documents_mask=mask.to(docs.dtype))  # (b, n_docs)
        return LossOutput(distillation_from_scores(student, batch.scores, self.normalize_scores))
