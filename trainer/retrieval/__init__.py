"""Retrieval: every way this project finds the top documents of a corpus for a query, by one key.

This module is light (no torch): the config's ``mine.retriever`` choices, the card's wording and "does this
retriever need a model?" all read :data:`RETRIEVERS`. The classes live beside it and are imported only
when a retriever is built (``trainer/retrieval/search.py``: :func:`~trainer.retrieval.search.build_retriever`):

======  ============  =================================================================================
key     retrieves     how
======  ============  =================================================================================
model   the ColBERT   exact MaxSim of the model being trained (its new projection included), sharded
plaid   the ColBERT   the same through a PLAID index per rank (corpora beyond exact MaxSim's memory)
dense   the base      the base model as the bi-encoder it was trained to be: its own pooling, cosine
bm25    no model      BM25 (``bm25s``)
hybrid  the base      ``bm25`` and ``dense`` fused by reciprocal rank (RRF, k=60)
======  ============  =================================================================================

Every one answers ``search(queries, positives, k)`` with the same candidate shape and is the same bytes on
1 rank or 64. A new retriever is one class and one line here.

>>> sorted(RETRIEVERS)
['bm25', 'dense', 'hybrid', 'model', 'plaid']
>>> [k for k, r in RETRIEVERS.items() if r.uses == "colbert"]
['model', 'plaid']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["RETRIEVERS", "Retriever", "round_retriever"]


@dataclass(frozen=True)
class Retriever:
    """A retriever's key, what it retrieves with in the first round, and its class (imported when built)."""

    key: str
    uses: Literal["colbert", "dense"] | None  # the ColBERT being trained, the base as a bi-encoder, or nothing
    cls: str  # "module:Class" under trainer.retrieval
    summary: str

    @property
    def needs_model(self) -> bool:
        return self.uses is not None


RETRIEVERS: dict[str, Retriever] = {
    r.key: r
    for r in (
        Retriever("model", "colbert", "exact:ModelRetriever", "exact MaxSim with the ColBERT, sharded over all ranks"),
        Retriever("plaid", "colbert", "plaid:PlaidRetriever", "the ColBERT through a PLAID index of each rank's share"),
        Retriever("dense", "dense", "dense:DenseRetriever", "the base model as a bi-encoder (its own pooling, cosine)"),
        Retriever("bm25", None, "bm25:Bm25Retriever", "BM25 (bm25s)"),
        Retriever("hybrid", "dense", "hybrid:HybridRetriever", "BM25 and dense fused by reciprocal rank"),
    )
}


def round_retriever(first: str, round_: int) -> str:
    """The key that retrieves in round ``round_``: ``first`` (``mine.retriever``) in round 1; later rounds
    retrieve with the ColBERT the round before trained, through PLAID if the first round used it.

    >>> round_retriever("hybrid", 1), round_retriever("hybrid", 2), round_retriever("plaid", 3)
    ('hybrid', 'model', 'plaid')
    """
    if round_ == 1:
        return first
    return "plaid" if first == "plaid" else "model"
