"""In-batch contrastive loss over ColBERT MaxSim scores, with cross-rank negatives."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pylate.scores import colbert_scores

from trainer.distributed import all_gather_no_grad, all_gather_with_grad, rank
from trainer.encode import encode_batch
from trainer.losses.base import LossOutput
from trainer.losses.hardness import hardness_sums

__all__ = ["Contrastive", "contrastive_from_embeddings", "contrastive_logits"]

SCORE_CHUNK = 16  # queries scored at once


def contrastive_from_embeddings(
    queries: torch.Tensor,  # (b, q_tokens, dim)
    documents: torch.Tensor,  # (b, n_docs, d_tokens, dim): positive first, then negatives
    documents_mask: torch.Tensor,  # (b, n_docs, d_tokens)
    temperature: float,
    gather: bool,
) -> torch.Tensor:
    """Cross-entropy of each query against every document in the (global) batch (:func:`contrastive_logits`)."""
    return F.cross_entropy(*contrastive_logits(queries, documents, documents_mask, temperature, gather))


def contrastive_logits(
    queries: torch.Tensor,  # (b, q_tokens, dim)
    documents: torch.Tensor,  # (b, n_docs, d_tokens, dim): positive first, then negatives
    documents_mask: torch.Tensor,  # (b, n_docs, d_tokens)
    temperature: float,
    gather: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query's logits over every document in the (global) batch, and the index of its positive.

    Returns the *mean over this rank's queries*. Averaging that over ranks gives the global-batch
    mean, and its gradient is exactly the single-process gradient of the same W*b examples:
    the gather's backward sums remote contributions, the gradient all-reduce divides by W.
    PyLate multiplies by W here, which makes the gradient W times too large.
    """
    b, n_docs = documents.shape[:2]
    if gather:
        # Every rank contributes its documents as negatives for every query.
        documents = all_gather_with_grad(documents)  # (W*b, n_docs, d_tokens, dim)
        documents_mask = all_gather_no_grad(documents_mask)
    flat_docs = documents.flatten(0, 1)  # (W*b*n_docs, d_tokens, dim)
    flat_mask = documents_mask.flatten(0, 1)  # (W*b*n_docs, d_tokens)
    doc_mask = flat_mask.to(queries.dtype)
    # Score a few queries at a time: the (queries, docs, q_tokens, d_tokens) similarity tensor is
    # transient per chunk (max's backward keeps only indices), so memory does not grow with b*W*b.
    scores = torch.cat(
        [colbert_scores(q, flat_docs, documents_mask=doc_mask) for q in queries.split(SCORE_CHUNK)]
    )  # (b, W*b*n_docs)
    offset = rank() * b if gather else 0
    labels = (offset + torch.arange(b, device=queries.device)) * n_docs  # index of each positive
    return scores.float() / temperature, labels


class Contrastive:
    """Encode queries and documents with gradients and score them: the mean loss, for the loop's backward."""

    def __init__(self, temperature: float = 1.0, gather: bool = True):
        self.temperature = temperature
        self.gather = gather

    def __call__(self, model, batch) -> LossOutput:
        queries, docs, mask = encode_batch(model, batch)
        logits, labels = contrastive_logits(queries, docs, mask, self.temperature, self.gather)
        return LossOutput(F.cross_entropy(logits, labels), hardness=hardness_sums(logits, labels, self.temperature))
