"""What every retriever shares: the candidate shape, the fixed corpus chunks dealt to the ranks, the running
top-k over those chunks and its merge across ranks, and :func:`build_retriever`, which builds one by key.

Each retriever answers ``search(queries, positives, k)`` with ``(candidates, positive_scores)``: per query,
``[(document index, score), ...]`` best first (ties to the lower index), and the scores of its positives.
Every chunk is encoded and scored with the same shapes on any world size, so the mined rows are the same
bytes on 1 rank or 64. Exact MaxSim costs ``queries x documents x query tokens x document tokens x dim``
multiply-adds: ``bench/mine.py`` measures it, PLAID and BM25 side by side.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from pathlib import Path

import torch

from trainer import distributed as D
from trainer.config.mine import MineConfig
from trainer.retrieval import RETRIEVERS

__all__ = ["DOC_CHUNK", "Candidates", "TopK", "build_retriever", "merge_shards", "my_chunks"]

log = logging.getLogger("trainer")
DOC_CHUNK = 512  # documents encoded and scored at once

Candidates = list[tuple[int, float]]  # (document index, score), best first


def my_chunks(documents: int) -> list[int]:
    """The first document of each fixed chunk this rank holds: chunks dealt round-robin, so the same chunks
    are encoded with the same shapes on any world size.

    >>> my_chunks(1200)  # one rank
    [0, 512, 1024]
    """
    return list(range(0, documents, DOC_CHUNK))[D.rank() :: D.world_size()]


class TopK:
    """The best ``keep`` documents per query over score chunks added in increasing document order (a
    stable sort: ties go to the lower index), and each query's positives' scores as they pass.

    >>> best = TopK(positives=[{1}], keep=2)
    >>> best.add(0, torch.tensor([[0.5, 0.9, 0.5]]))
    >>> best.values.tolist(), best.ids.tolist(), best.positive_scores
    ([[0.8999999761581421, 0.5]], [[1, 0]], [{1: 0.8999999761581421}])
    """

    def __init__(self, positives: list[set[int]], keep: int):
        self.positives, self.keep = positives, keep
        self.values = torch.full((len(positives), 0), float("-inf"))
        self.ids = torch.zeros((len(positives), 0), dtype=torch.long)
        self.positive_scores: list[dict[int, float]] = [{} for _ in positives]

    def add(self, start: int, scores: torch.Tensor) -> None:
        """``scores``: (queries, documents start..start+n) on the host."""
        n = scores.shape[1]
        for qi, pos in enumerate(self.positives):
            for p in pos:
                if start <= p < start + n:
                    self.positive_scores[qi][p] = float(scores[qi, p - start])
        idx = torch.arange(start, start + n).expand(len(self.positives), -1)
        vals, ids = torch.cat([self.values, scores], 1), torch.cat([self.ids, idx], 1)
        order = vals.sort(dim=1, descending=True, stable=True).indices[:, : self.keep]
        self.values, self.ids = vals.gather(1, order), ids.gather(1, order)

    def merged(self) -> tuple[list[Candidates], list[dict]]:
        """Every rank's best -> the global best (ties to the lower index), on every rank."""
        return merge_shards(D.gather_objects((self.values, self.ids, self.positive_scores)), self.keep)


def merge_shards(shards: list, keep: int) -> tuple[list[Candidates], list[dict]]:
    """Every rank's best of its chunks -> the global best per query (ties to the lower document index),
    and the positives' scores."""
    candidates = []
    for qi in range(len(shards[0][0])):
        found = [(int(i), float(v)) for values, ids, _ in shards for v, i in zip(values[qi], ids[qi])]
        candidates.append(sorted(found, key=lambda c: (-c[1], c[0]))[:keep])
    positive_scores = [dict() for _ in candidates]
    for _, _, per_rank in shards:
        for qi, found in enumerate(per_rank):
            positive_scores[qi].update(found)
    return candidates, positive_scores


def build_retriever(
    key: str, model, corpus: list[str], mcfg: MineConfig, show: bool, plaid_dir: Path, on_chunk: Callable
):
    """The retriever of ``key`` (:func:`~trainer.retrieval.round_retriever`), with the corpus (this rank's
    share of it) indexed or encoded; ``on_chunk`` after each chunk encoded. ``model`` is what
    :data:`~trainer.retrieval.RETRIEVERS` says the key uses: a ColBERT, a sentence-transformers
    bi-encoder, or None."""
    kind = RETRIEVERS[key]
    log.info("mine: retrieving with %s (%s)", key, kind.summary)
    module, name = kind.cls.split(":")
    cls = getattr(importlib.import_module(f"trainer.retrieval.{module}"), name)
    device = next(model.parameters()).device if model is not None else torch.device("cpu")
    return cls.build(
        model=model, corpus=corpus, mcfg=mcfg, show=show, device=device, plaid_dir=plaid_dir, on_chunk=on_chunk
    )
