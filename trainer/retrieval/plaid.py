"""PLAID (PyLate's fast-plaid) over each rank's share of the corpus, for corpora beyond exact MaxSim's memory."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch

from trainer import distributed as D
from trainer.encode import embed_texts
from trainer.retrieval.search import DOC_CHUNK, Candidates, merge_shards, my_chunks

__all__ = ["PlaidRetriever", "build_index", "build_index_in_chunks", "search_index"]


def build_index(folder: Path, name: str, nbits: int, ids: list[str], embeddings, seed: int):
    """A PLAID index (PyLate's, fast-plaid backend) of ``embeddings`` under ``folder/name``: mining's per-rank
    indexes and the job's final index (``trainer/index.py``) are built here alike. fast-plaid samples its
    k-means points from torch's global stream: seeded, so a rebuild (a restart) is the same index."""
    from pylate import indexes

    index = indexes.PLAID(index_folder=str(folder), index_name=name, override=True, nbits=nbits, show_progress=False)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        index.add_documents(documents_ids=ids, documents_embeddings=embeddings)
    return index


def build_index_in_chunks(
    folder: Path,
    name: str,
    nbits: int,
    ids: list[str],
    texts: list[str],
    encode: Callable[[list[str]], list],
    seed: int,
    chunk: int,
):
    """:func:`build_index` of ``texts``, encoded ``chunk`` documents at a time, so that the build holds one
    chunk's float embeddings beside the index, whatever the corpus's size. The first chunk creates the index
    (fast-plaid's k-means centroids come from its tokens: give it a representative chunk); each later one is
    fast-plaid's update, which compresses it against those centroids and adds centroids where its tokens fall far
    from all of them. fast-plaid's ``low_memory`` keeps the index's codes and residuals in host memory on a GPU
    while it builds. Returns the index and the number of tokens it holds."""
    from pylate import indexes

    index = indexes.PLAID(
        index_folder=str(folder), index_name=name, override=True, nbits=nbits, show_progress=False, low_memory=True
    )
    tokens = 0
    quiet = logging.getLogger("pylate.indexes.fast_plaid")  # its warning at every update: adding chunks is the plan
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            for start in range(0, len(texts), chunk):
                docs = encode(texts[start : start + chunk])  # each (tokens, dim)
                tokens += sum(len(d) for d in docs)
                index.add_documents(documents_ids=ids[start : start + chunk], documents_embeddings=docs)
                del docs
    finally:
        quiet.setLevel(level)
    return index, tokens


def search_index(index, queries_embeddings, k: int) -> list[list[tuple[str, float]]]:
    """The top ``k`` (document id, PLAID score) of each query, best first."""
    return [[(h["id"], float(h["score"])) for h in hits] for hits in index(queries_embeddings, k=k)]


class PlaidRetriever:
    """Beyond what exact MaxSim holds in memory (about 1M documents on GPUs, an estimate): each rank
    builds a PLAID index (PyLate's fast-plaid) of its share of the corpus, the same fixed chunks as
    :class:`ModelRetriever`, answers every query from it, and the per-rank top-k lists are merged.

    Candidates carry PLAID's scores (MaxSim over compressed embeddings); the positives' scores, which
    ``max_score_ratio`` divides by, are exact, computed by the rank whose share holds the positive."""

    @classmethod
    def build(cls, model, corpus, mcfg, show, device, plaid_dir, **_) -> PlaidRetriever:
        return cls(model, corpus, mcfg.batch_size, device, show, mcfg.nbits, plaid_dir)

    def __init__(
        self, model, corpus: list[str], batch_size: int, device, show: bool, nbits: int, folder: Path, seed: int = 0
    ):
        self.model, self.corpus, self.batch_size, self.device = model, corpus, batch_size, device
        self.ids = [i for s in my_chunks(len(corpus)) for i in range(s, min(s + DOC_CHUNK, len(corpus)))]
        self.index = None
        model.eval()
        if self.ids:  # a rank past the last chunk holds nothing
            docs = model.encode(
                [corpus[i] for i in self.ids], is_query=False, batch_size=batch_size, show_progress_bar=show
            )
            self.index = build_index(folder, f"rank-{D.rank()}", nbits, [str(i) for i in self.ids], docs, seed)

    @torch.no_grad()
    def search(self, queries: list[str], positives: list[set[int]], k: int) -> tuple[list[Candidates], list[dict]]:
        from pylate.scores import colbert_scores

        keep = k + max(len(p) for p in positives)
        found: list[Candidates] = [[] for _ in queries]
        if self.index is not None:
            q = self.model.encode(queries, is_query=True, batch_size=self.batch_size, show_progress_bar=False)
            for qi, hits in enumerate(search_index(self.index, q, min(keep, len(self.ids)))):
                found[qi] = [(int(d), s) for d, s in hits]
        positive_scores: list[dict[int, float]] = [{} for _ in queries]
        owned = set(self.ids)
        held = sorted({p for pos in positives for p in pos} & owned)
        if held:
            q_emb, _ = embed_texts(self.model, queries, True, self.batch_size, self.model.query_length, self.device)
            d_emb, d_mask = embed_texts(
                self.model,
                [self.corpus[p] for p in held],
                False,
                self.batch_size,
                self.model.document_length,
                self.device,
            )
            scores = colbert_scores(q_emb, d_emb, documents_mask=d_mask.float()).cpu()
            column = {p: j for j, p in enumerate(held)}
            for qi, pos in enumerate(positives):
                positive_scores[qi].update({p: float(scores[qi, column[p]]) for p in pos if p in column})
        values = [[v for _, v in f] for f in found]
        ids = [[i for i, _ in f] for f in found]
        return merge_shards(D.gather_objects((values, ids, positive_scores)), keep)
