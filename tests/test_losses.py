"""Each loss on its own, on embeddings (no model, no process group): invariants that can fail."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.losses import contrastive_from_embeddings, distillation_from_scores


def _embeddings(b: int = 6, n_docs: int = 2, q_tok: int = 8, d_tok: int = 12, dim: int = 16):
    g = torch.Generator().manual_seed(0)
    queries = F.normalize(torch.randn(b, q_tok, dim, generator=g), dim=-1)
    # each query's positive shares its tokens (plus noise); the negative is random
    positives = F.normalize(torch.cat([queries, torch.randn(b, d_tok - q_tok, dim, generator=g)], 1) * 1.0, dim=-1)
    negatives = F.normalize(torch.randn(b, n_docs - 1, d_tok, dim, generator=g), dim=-1)
    docs = torch.cat([positives.unsqueeze(1), negatives], dim=1)  # (b, n_docs, d_tok, dim)
    mask = torch.ones(b, n_docs, d_tok, dtype=torch.bool)
    return queries, docs, mask


def test_contrastive_is_a_positive_scalar_with_gradients():
    q, d, m = _embeddings()
    q.requires_grad_()
    d.requires_grad_()
    loss = contrastive_from_embeddings(q, d, m, temperature=1.0, gather=False)
    assert loss.dim() == 0 and loss.item() > 0
    loss.backward()
    assert q.grad.abs().sum() > 0 and d.grad.abs().sum() > 0


def test_contrastive_prefers_matched_pairs():
    q, d, m = _embeddings()
    matched = contrastive_from_embeddings(q, d, m, 1.0, gather=False)
    shuffled = contrastive_from_embeddings(q, d[torch.roll(torch.arange(len(d)), 1)], m, 1.0, gather=False)
    assert matched < shuffled


def test_contrastive_ignores_masked_tokens():
    q, d, m = _embeddings()
    base = contrastive_from_embeddings(q, d, m, 1.0, gather=False)
    padded_d = torch.cat([d, F.normalize(torch.randn(*d.shape[:2], 5, d.shape[-1]), dim=-1)], dim=2)
    padded_m = torch.cat([m, torch.zeros(*m.shape[:2], 5, dtype=torch.bool)], dim=2)
    assert torch.allclose(base, contrastive_from_embeddings(q, padded_d, padded_m, 1.0, gather=False), atol=1e-6)


def test_contrastive_chunking_does_not_change_the_loss():
    from trainer.losses import contrastive as module

    q, d, m = _embeddings(b=40)
    full = contrastive_from_embeddings(q, d, m, 1.0, gather=False)
    old, module.SCORE_CHUNK = module.SCORE_CHUNK, 3
    try:
        chunked = contrastive_from_embeddings(q, d, m, 1.0, gather=False)
    finally:
        module.SCORE_CHUNK = old
    assert torch.allclose(full, chunked, atol=1e-6)


def test_distillation_is_zero_when_student_matches_teacher():
    teacher = torch.tensor([[3.0, 1.0, 0.5], [0.2, 2.0, 1.0]])
    assert distillation_from_scores(teacher.clone(), teacher).abs() < 1e-6
    student = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 0.5]], requires_grad=True)
    loss = distillation_from_scores(student, teacher)
    assert loss > 0
    loss.backward()
    assert student.grad.abs().sum() > 0


def test_hardness_equals_a_plain_reference_and_sees_stale_negatives():
    """The margin (positive minus the hardest other document) and the share of rows with a near-zero loss,
    against a loop over rows in plain Python; matched pairs are easier than shuffled ones."""
    import math

    from trainer.losses.contrastive import contrastive_logits
    from trainer.losses.hardness import EASY_LOSS, hardness_sums, summarize

    q, d, m = _embeddings(b=8, n_docs=3)
    for docs, temperature in ((d, 1.0), (d, 0.05), (d[torch.roll(torch.arange(len(d)), 1)], 0.05)):
        logits, labels = contrastive_logits(q, docs, m, temperature, gather=False)
        got = summarize(hardness_sums(logits, labels, temperature).tolist())
        margins, easy = [], 0
        for row, label in zip(logits.tolist(), labels.tolist()):
            others = [v for j, v in enumerate(row) if j != label]
            margins.append((row[label] - max(others)) * temperature)
            loss = -row[label] + math.log(sum(math.exp(v) for v in row))
            easy += loss < EASY_LOSS
        assert math.isclose(got["margin"], sum(margins) / len(margins), rel_tol=1e-5, abs_tol=1e-6)
        assert got["easy_share"] == easy / len(margins)
    matched = summarize(hardness_sums(*contrastive_logits(q, d, m, 0.05, gather=False), 0.05).tolist())
    shuffled = summarize(hardness_sums(*contrastive_logits(q, d.roll(1, 0), m, 0.05, gather=False), 0.05).tolist())
    assert matched["margin"] > 0 > shuffled["margin"] and matched["easy_share"] > shuffled["easy_share"]
