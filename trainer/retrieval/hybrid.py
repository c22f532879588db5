"""BM25 and the base bi-encoder fused by reciprocal rank (RRF): the words the query shares and what it means.

A candidate's score is ``sum(1 / (RRF_K + rank))`` over the two lists it is in (Cormack et al., 2009, k=60).
A query BM25 cannot search (only stopwords) takes the dense list alone. The positives' scores are fused the
same way from their ranks in each full list, so ``mine.max_score_ratio`` compares like with like.
"""

from __future__ import annotations

from trainer.retrieval.bm25 import Bm25Retriever
from trainer.retrieval.dense import DenseRetriever
from trainer.retrieval.search import Candidates

__all__ = ["RRF_K", "HybridRetriever", "fuse"]

RRF_K = 60


def fuse(lists: list[Candidates], keep: int) -> tuple[Candidates, dict[int, int]]:
    """Reciprocal-rank fusion of ranked lists: the best ``keep`` (ties to the lower index), and each
    document's fused score.

    >>> fuse([[(7, 9.0), (3, 5.0)], [(3, 0.9), (8, 0.8)]], keep=3)[0]
    [(3, 0.03252247488101534), (7, 0.01639344262295082), (8, 0.016129032258064516)]
    """
    fused: dict[int, float] = {}
    for found in lists:
        for rank, (doc, _) in enumerate(found, 1):
            fused[doc] = fused.get(doc, 0.0) + 1.0 / (RRF_K + rank)
    best = sorted(fused.items(), key=lambda c: (-c[1], c[0]))[:keep]
    return best, fused


class HybridRetriever:
    """Both retrievers over the whole corpus, each sharded as it is alone, fused on every rank alike."""

    @classmethod
    def build(cls, model, corpus, mcfg, show, on_chunk, **_) -> HybridRetriever:
        return cls(Bm25Retriever(corpus, show), DenseRetriever(model, corpus, mcfg.batch_size, show, on_chunk))

    def __init__(self, bm25: Bm25Retriever, dense: DenseRetriever):
        self.bm25, self.dense = bm25, dense

    def search(self, queries: list[str], positives: list[set[int]], k: int) -> tuple[list[Candidates], list[dict]]:
        depth = 2 * k  # each list deeper than the fused top-k, so a document ranked well by one is not cut
        lexical, _ = self.bm25.search(queries, positives, depth)
        semantic, _ = self.dense.search(queries, positives, depth)
        keep = k + max(len(p) for p in positives)
        candidates, positive_scores = [], []
        for words, meaning, pos in zip(lexical, semantic, positives):
            best, fused = fuse([meaning] if words is None else [words, meaning], keep)
            candidates.append(best)
            positive_scores.append({p: fused.get(p, 0.0) for p in pos})
        return candidates, positive_scores
