"""Retrieval metrics equal trec_eval's (through pytrec_eval) on graded qrels with tied scores."""

from __future__ import annotations

import random

import pytest

from trainer.evaluate import retrieval_metrics, trec_order

TREC_MEASURES = {"ndcg_cut.10", "recip_rank", "recall.100", "map_cut.100"}


def _reference(run, qrels) -> dict[str, float]:
    import pytrec_eval

    # MRR@10 is trec_eval's recip_rank over the top 10; the other cut-offs are trec_eval's own
    top10 = {q: {d: run[q][d] for d in trec_order(run[q])[:10]} for q in run}
    full = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100", "map_cut.100"}).evaluate(run)
    rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    n = len(qrels)
    return {
        "ndcg@10": sum(full[q]["ndcg_cut_10"] for q in full) / n,
        "mrr@10": sum(rr[q]["recip_rank"] for q in rr) / n,
        "recall@100": sum(full[q]["recall_100"] for q in full) / n,
        "map@100": sum(full[q]["map_cut_100"] for q in full) / n,
    }


def _graded_case(seed: int):
    rng = random.Random(seed)
    docs = [f"d{i:03d}" for i in range(150)]
    qrels = {f"q{q}": {d: rng.choice([0, 1, 2, 3]) for d in rng.sample(docs, 12)} for q in range(30)}
    for judged in qrels.values():  # at least one relevant document per query
        judged[next(iter(judged))] = max(1, next(iter(judged.values())))
    # scores drawn from a few values: many ties, which trec_eval breaks by document id
    run = {q: {d: float(rng.choice([0.1, 0.5, 0.5, 0.9, 1.0])) for d in rng.sample(docs, 100)} for q in qrels}
    return run, qrels


@pytest.mark.parametrize("seed", range(5))
def test_metrics_equal_trec_eval_on_graded_qrels_with_ties(seed):
    run, qrels = _graded_case(seed)
    ours, ref = retrieval_metrics(run, qrels), _reference(run, qrels)
    assert ours.keys() == ref.keys()
    for k in ours:
        assert ours[k] == pytest.approx(ref[k], abs=1e-9), k


def test_gain_is_linear_not_exponential():
    """A relevance-3 document at rank 1 of 2 judged (3, 1): linear gain, the BEIR/trec_eval number."""
    import math

    qrels = {"q": {"a": 3, "b": 1}}
    run = {"q": {"b": 2.0, "a": 1.0}}
    ndcg = retrieval_metrics(run, qrels)["ndcg@10"]
    assert ndcg == pytest.approx((1 + 3 / math.log2(3)) / (3 + 1 / math.log2(3)))
    assert ndcg != pytest.approx((1 + 7 / math.log2(3)) / (7 + 1 / math.log2(3)))
