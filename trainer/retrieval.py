"""Retrieval for mining: the top-k documents of a corpus for each query, in one candidate shape.

Three retrievers answer ``search(queries, positives, k)`` with ``(candidates, positive_scores)``: per query,
``[(document index, score), ...]`` best first (ties to the lower index), and the scores of its positives:

* :class:`ModelRetriever`: exact MaxSim with a ColBERT model, the corpus cut into fixed chunks of
  ``DOC_CHUNK`` documents dealt round-robin to the ranks; the per-rank lists are merged.
* :class:`PlaidRetriever`: the same chunks through a PLAID index per rank (PyLate's fast-plaid), for
  corpora beyond what exact MaxSim holds in memory.
* :class:`Bm25Retriever`: BM25 (``bm25s``) over the whole corpus, the queries dealt to the ranks; a query
  with no searchable word gets None.

:func:`build_retriever` picks one as ``mine.retriever`` and the model say. Every chunk is encoded and
scored with the same shapes on any world size, so the mined rows are the same bytes on 1 rank or 64.
Exact MaxSim costs ``queries x documents x query tokens x document tokens x dim`` multiply-adds:
``bench/mine.py`` measures it, PLAID and BM25 side by side.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from trainer import distributed as D
from trainer.config_mine import MineConfig
from trainer.encode import embed_texts

__all__ = ["DOC_CHUNK", "Bm25Retriever", "Candidates", "ModelRetriever", "PlaidRetriever", "build_retriever"]

log = logging.getLogger("trainer")
DOC_CHUNK = 512  # documents encoded and scored at once
_QUERY_BLOCK = 64  # queries scored at once against a document chunk

Candidates = list[tuple[int, float]]  # (document index, score), best first


def _my_chunks(documents: int) -> list[int]:
    """The first document of each fixed chunk this rank holds: chunks dealt round-robin, so the same chunks
    are encoded with the same shapes on any world size."""
    return list(range(0, documents, DOC_CHUNK))[D.rank() :: D.world_size()]


def _scoring_width(mask: torch.Tensor) -> int:
    """Columns up to the last one any document scores with: trimming there changes no MaxSim.

    Not the largest *count* of scoring tokens: the mask drops punctuation inside a document, so a
    document's last scoring token can sit past that count.

    >>> _scoring_width(torch.tensor([[1, 0, 1, 0], [1, 1, 0, 0]], dtype=torch.bool))
    3
    >>> _scoring_width(torch.zeros(2, 4, dtype=torch.bool))
    1
    """
    columns = mask.any(0).nonzero()
    return int(columns.max()) + 1 if len(columns) else 1


class ModelRetriever:
    """Exact MaxSim of the model being trained. The corpus is cut into fixed chunks of ``DOC_CHUNK``
    documents, dealt round-robin to the ranks; each rank encodes its chunks once (fp16, trimmed to the
    chunk's longest document) and scores every query against them, and the per-rank lists are merged.

    Every chunk is encoded and scored with the same shapes on any world size, and ties go to the
    lower document index, so the mined rows are the same bytes on 1 rank or 64. ``on_chunk`` is called
    after each chunk this rank encoded (the job's progress)."""

    def __init__(self, model, corpus: list[str], batch_size: int, device, show: bool, on_chunk=lambda: None):
        self.model, self.batch_size, self.device = model, batch_size, device
        starts = _my_chunks(len(corpus))
        self.chunks: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        model.eval()
        for start in tqdm(starts, desc="mine: encode corpus", disable=not show, unit="chunk"):
            texts = corpus[start : start + DOC_CHUNK]
            emb, mask = embed_texts(model, texts, False, batch_size, model.document_length, device)
            width = _scoring_width(mask)
            self.chunks.append((start, emb[:, :width].half(), mask[:, :width]))
            on_chunk()

    @torch.no_grad()
    def search(self, queries: list[str], positives: list[set[int]], k: int) -> tuple[list[Candidates], list[dict]]:
        from pylate.scores import colbert_scores

        q_emb, _ = embed_texts(self.model, queries, True, self.batch_size, self.model.query_length, self.device)
        keep = k + max(len(p) for p in positives)  # the positives may take places in the top-k
        best_v = torch.full((len(queries), 0), float("-inf"))
        best_i = torch.zeros((len(queries), 0), dtype=torch.long)
        positive_scores: list[dict[int, float]] = [{} for _ in queries]
        for start, d_emb, d_mask in self.chunks:
            d = d_emb.float()
            scores = torch.cat(
                [
                    colbert_scores(q_emb[i : i + _QUERY_BLOCK], d, documents_mask=d_mask.float())
                    for i in range(0, len(q_emb), _QUERY_BLOCK)
                ]
            ).cpu()
            for qi, pos in enumerate(positives):
                for p in pos:
                    if start <= p < start + len(d):
                        positive_scores[qi][p] = float(scores[qi, p - start])
            idx = torch.arange(start, start + len(d)).expand(len(queries), -1)
            # chunks come in increasing index order, so a stable sort breaks ties by lower index
            vals, ids = torch.cat([best_v, scores], 1), torch.cat([best_i, idx], 1)
            order = vals.sort(dim=1, descending=True, stable=True).indices[:, :keep]
            best_v, best_i = vals.gather(1, order), ids.gather(1, order)
        return _merge(D.gather_objects((best_v, best_i, positive_scores)), keep)


class PlaidRetriever:
    """Beyond what exact MaxSim holds in memory (about 1M documents on GPUs, ``docs/mining.md``): each rank
    builds a PLAID index (PyLate's fast-plaid) of its share of the corpus, the same fixed chunks as
    :class:`ModelRetriever`, answers every query from it, and the per-rank top-k lists are merged.

    Candidates carry PLAID's scores (MaxSim over compressed embeddings); the positives' scores, which
    ``max_score_ratio`` divides by, are exact, computed by the rank whose share holds the positive."""

    def __init__(self, model, corpus: list[str], batch_size: int, device, show: bool, nbits: int, folder: Path):
        from pylate import indexes

        self.model, self.corpus, self.batch_size, self.device = model, corpus, batch_size, device
        self.ids = [i for s in _my_chunks(len(corpus)) for i in range(s, min(s + DOC_CHUNK, len(corpus)))]
        self.index = None
        model.eval()
        if self.ids:  # a rank past the last chunk holds nothing
            docs = model.encode([corpus[i] for i in self.ids], is_query=False, batch_size=batch_size,
                                show_progress_bar=show)  # fmt: skip
            self.index = indexes.PLAID(index_folder=str(folder), index_name=f"rank-{D.rank()}", override=True,
                                       nbits=nbits, show_progress=False)  # fmt: skip
            self.index.add_documents(documents_ids=[str(i) for i in self.ids], documents_embeddings=docs)

    @torch.no_grad()
    def search(self, queries: list[str], positives: list[set[int]], k: int) -> tuple[list[Candidates], list[dict]]:
        from pylate.scores import colbert_scores

        keep = k + max(len(p) for p in positives)
        found: list[Candidates] = [[] for _ in queries]
        if self.index is not None:
            q = self.model.encode(queries, is_query=True, batch_size=self.batch_size, show_progress_bar=False)
            for qi, hits in enumerate(self.index(q, k=min(keep, len(self.ids)))):
                found[qi] = [(int(h["id"]), float(h["score"])) for h in hits]
        positive_scores: list[dict[int, float]] = [{} for _ in queries]
        owned = set(self.ids)
        held = sorted({p for pos in positives for p in pos} & owned)
        if held:
            q_emb, _ = embed_texts(self.model, queries, True, self.batch_size, self.model.query_length, self.device)
            d_emb, d_mask = embed_texts(self.model, [self.corpus[p] for p in held], False, self.batch_size,
                                        self.model.document_length, self.device)  # fmt: skip
            scores = colbert_scores(q_emb, d_emb, documents_mask=d_mask.float()).cpu()
            column = {p: j for j, p in enumerate(held)}
            for qi, pos in enumerate(positives):
                positive_scores[qi].update({p: float(scores[qi, column[p]]) for p in pos if p in column})
        values = [[v for _, v in f] for f in found]
        ids = [[i for i, _ in f] for f in found]
        return _merge(D.gather_objects((values, ids, positive_scores)), keep)


class Bm25Retriever:
    """BM25 (the ``bm25s`` library) over the whole corpus on every rank; each rank answers every
    world-size-th query and the answers are gathered. Only documents sharing a word with the query
    (score > 0) are candidates, so a query that matches few documents gets a short list."""

    def __init__(self, corpus: list[str], show: bool):
        import bm25s

        self.bm25s = bm25s
        self.index = bm25s.BM25()
        self.index.index(bm25s.tokenize(corpus, stopwords="en", show_progress=show), show_progress=show)

    def search(
        self, queries: list[str], positives: list[set[int]], k: int
    ) -> tuple[list[Candidates | None], list[dict]]:
        """None for a query with no word BM25 can search for."""
        rank, world = D.rank(), D.world_size()
        mine = list(range(rank, len(queries), world))
        tokens = self.bm25s.tokenize([queries[i] for i in mine], stopwords="en", return_ids=False, show_progress=False)
        answers = []
        for qi, words in zip(mine, tokens):
            if not words:  # stopwords, punctuation, one-letter words: nothing to rank by (bm25s raises IndexError)
                answers.append((qi, None, {}))
                continue
            scores = torch.from_numpy(self.index.get_scores(words))
            top = scores.sort(descending=True, stable=True)  # ties go to the lower index
            keep = k + len(positives[qi])
            # a document scored 0 shares no word with the query: BM25 knows nothing of it, so it is no candidate
            cands = [(int(i), float(v)) for v, i in zip(top.values[:keep], top.indices[:keep]) if v > 0]
            answers.append((qi, cands, {p: float(scores[p]) for p in positives[qi]}))
        merged = sorted((a for part in D.gather_objects(answers) for a in part), key=lambda a: a[0])
        return [a[1] for a in merged], [a[2] for a in merged]


def _merge(shards: list, keep: int) -> tuple[list[Candidates], list[dict]]:
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


def build_retriever(model, corpus: list[str], mcfg: MineConfig, show: bool, plaid_dir: Path, on_chunk: Callable):
    """BM25 (no model), PLAID or exact MaxSim, as the model and ``mine.retriever`` say, with the corpus
    (this rank's share of it) indexed or encoded; ``on_chunk`` after each chunk exact MaxSim encodes."""
    plaid = model is not None and mcfg.retriever == "plaid"
    log.info("mine: retrieving with %s", "BM25" if model is None else "PLAID" if plaid else "exact MaxSim")
    if model is None:
        return Bm25Retriever(corpus, show)
    device = next(model.parameters()).device
    if plaid:
        return PlaidRetriever(model, corpus, mcfg.batch_size, device, show, mcfg.nbits, plaid_dir)
    return ModelRetriever(model, corpus, mcfg.batch_size, device, show, on_chunk)
