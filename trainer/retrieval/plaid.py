"""PLAID indexes: built with PyLate's ``PLAID`` (fast-plaid backend), searched in memory by :class:`PlaidSearch`.

Every PLAID search of the project goes through :class:`PlaidSearch`: mining's per-rank indexes
(:class:`PlaidRetriever`, for corpora beyond exact MaxSim's memory), the index phase's evaluation
(``trainer/index.py``) and serving (``trainer/serve/plaid.py``). It holds fast-plaid's index and the document id
of each PLAID id in memory (PyLate's ``PLAID.__call__`` reads both id mappings from disk on every call), and asks
fast-plaid for as many candidates as the top k needs (:func:`full_scores`: 256 for a top 10).
"""

from __future__ import annotations

import functools
import json
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from trainer import distributed as D
from trainer.encode import embed_texts
from trainer.retrieval.exact import own_columns
from trainer.retrieval.search import DOC_CHUNK, Candidates, merge_shards, my_chunks

__all__ = [
    "ENCODE_CHUNK",
    "FAST_PLAID_DIR",
    "Built",
    "IdsMismatch",
    "PlaidRetriever",
    "PlaidSearch",
    "build_index",
    "build_index_in_chunks",
    "chunk_order",
    "cpu_flags",
    "full_scores",
    "half_is_slow",
    "time_left",
    "x86_without",
]

ENCODE_CHUNK = 10_000  # documents encoded and added at a time: about 1 GB of float32 at 180 tokens, dim 128
FAST_PLAID_DIR = "fast_plaid_index"  # where PyLate's PLAID keeps fast-plaid's index, under its index_name

# fast-plaid's n_full_scores for a top k: the candidates it keeps by their centroid scores, a quarter of which
# (at least k) it decompresses and scores exactly (PLAID's ndocs). PyLate passes 8,192 whatever k, and a CPU
# query's cost grows with it. For a top 10, 256 (PLAID's own searcher's ``ndocs`` for k <= 10) kept nDCG@10 equal
# on a real split with a trained model, at a fifteenth of the cost; for a top 100, PLAID's 1,024 found fewer of
# exact MaxSim's top 100 than 8,192 did, so past k 10 the search keeps PyLate's 8,192 (4k beyond k 2,048).
# bench/plaid_recall.py measures it; the results page has the figures.
FEW, FEW_SCORES, DEFAULT_SCORES = 10, 256, 8192

log = logging.getLogger("trainer")
_warned_half = False  # the slow-float16 line, once a process (mining builds an index a rank)


def full_scores(k: int) -> int:
    """fast-plaid's ``n_full_scores`` for a top ``k``: the candidates kept by their centroid scores (a quarter of
    them, at least ``k``, decompressed and scored exactly).

    >>> [full_scores(k) for k in (1, 10, 11, 100, 2048, 3000)]
    [256, 256, 8192, 8192, 8192, 12000]
    """
    return FEW_SCORES if k <= FEW else max(DEFAULT_SCORES, 4 * k)


def half_is_slow(flags: str | None = None, machine: str | None = None) -> bool:
    """Whether this CPU computes float16 on torch's slow path: an x86 CPU without AVX512-FP16 or AMX-FP16.
    fast-plaid searches in float16 on a CPU too; on such a CPU a query's 32 x 17,000 product took 13 ms in
    float16 against 2.7 in float32 (torch 2.11, one thread, a 2-core AMD EPYC). ``flags``: /proc/cpuinfo's.

    >>> half_is_slow("fpu avx2 avx512f avx512_bf16", "x86_64"), half_is_slow("avx512f avx512_fp16", "x86_64")
    (True, False)
    >>> half_is_slow("fp asimd fphp asimdhp", "aarch64")
    False
    """
    return x86_without({"avx512_fp16", "amx_fp16"}, flags, machine)


def x86_without(features: set[str], flags: str | None = None, machine: str | None = None) -> bool:
    """Whether this is an x86 CPU whose flags (``flags``, else :func:`cpu_flags`) name none of ``features``: where
    torch takes its slow path for a number format. False on another architecture, or where no flags are known.

    >>> x86_without({"avx512_bf16"}, "avx2 fma", "x86_64"), x86_without({"avx512_bf16"}, "", "x86_64")
    (True, False)
    """
    import platform

    if (machine or platform.machine()) not in ("x86_64", "AMD64"):
        return False  # the slow paths measured are x86's
    flags = cpu_flags() if flags is None else flags
    return bool(flags) and not features & set(flags.split())  # no flags known: say nothing


@functools.cache
def cpu_flags() -> str:
    """The CPU's flags, from Linux's /proc/cpuinfo ("" elsewhere): read once a process."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    return next((line.split(":", 1)[1] for line in cpuinfo.splitlines() if line.startswith("flags")), "")


class IdsMismatch(ValueError):
    """The ids given are not one per document of the index."""


class PlaidSearch:
    """A built PLAID index held in memory: fast-plaid's public ``FastPlaid`` over ``folder`` (PyLate's
    ``INDEX_NAME/fast_plaid_index``) and ``ids``, the document of each PLAID id (0, 1, ... in the order added), on
    ``device``.
    ``search`` reads no file (fast-plaid stats its ``metadata.json`` to notice a rebuilt index)."""

    def __init__(self, folder: Path, ids: list[str], device: str | None = None, threads: int = 1):
        from fast_plaid import search

        held = json.loads((Path(folder) / "metadata.json").read_text())["num_documents"]
        if held != len(ids):
            raise IdsMismatch(f"the PLAID index holds {held} documents, its ids {len(ids)}")
        self.ids, self.threads = list(ids), threads
        # device None: a GPU where one is visible, as PyLate's PLAID; the index held in the device's memory
        # (fast-plaid's low_memory keeps it on the host, for builds), as PyLate searches
        self._fast = search.FastPlaid(index=str(folder), device=device, low_memory=False)
        global _warned_half
        on_cpu = (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cpu")
        if on_cpu and not _warned_half and half_is_slow():
            _warned_half = True
            log.warning(
                "PLAID search on this CPU is slow: fast-plaid scores in float16, and this CPU has no AVX512-FP16 "
                "or AMX-FP16, so torch takes its slow float16 path (about 5x float32's time); a GPU or a CPU with "
                "AVX512-FP16 (Intel Sapphire Rapids or later) does not"
            )

    def search(self, queries_embeddings, k: int, n_full_scores: int | None = None) -> list[list[tuple[str, float]]]:
        """The top ``k`` (document id, PLAID score) of each query, best first; a query is its token embeddings
        (tokens, dim), as PyLate's ``encode`` gives them. ``threads``: fast-plaid searches that many queries at
        once on a CPU (its joblib threads); ``n_full_scores``: :func:`full_scores` unless given."""
        found = self._fast.search(
            queries_embeddings=[torch.as_tensor(q) for q in queries_embeddings],
            top_k=k,
            n_full_scores=n_full_scores or full_scores(k),
            n_ivf_probe=8,  # fast-plaid's and PyLate's default
            n_processes=max(1, min(self.threads, len(queries_embeddings))),
            show_progress=False,
        )
        return [[(self.ids[p], float(s)) for p, s in hits if 0 <= p < len(self.ids)] for hits in found]


def build_index(folder: Path, name: str, nbits: int, ids: list[str], embeddings, seed: int) -> PlaidSearch:
    """A PLAID index (PyLate's, fast-plaid backend) of ``embeddings`` under ``folder/name``, ready to search:
    mining's per-rank indexes and the job's final index (``trainer/index.py``) are built here alike. fast-plaid
    samples its k-means points from torch's global stream: seeded, so a rebuild (a restart) is the same index."""
    from pylate import indexes

    index = indexes.PLAID(index_folder=str(folder), index_name=name, override=True, nbits=nbits, show_progress=False)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        index.add_documents(documents_ids=ids, documents_embeddings=embeddings)
    del index  # PyLate's copy of the index in memory: the search below loads its own
    return PlaidSearch(Path(folder) / name / FAST_PLAID_DIR, ids)


def chunk_order(n: int, chunk: int, seed: int) -> list[int]:
    """The order in which :func:`build_index_in_chunks` should add ``n`` documents: as given when they fit one
    chunk, else a seeded shuffle, so that the first chunk, whose tokens train the centroids, is a sample of the
    whole corpus rather than its head.

    >>> chunk_order(3, 10, 0)
    [0, 1, 2]
    >>> sorted(chunk_order(30, 10, 0)) == list(range(30)) != chunk_order(30, 10, 0)
    True
    """
    order = list(range(n))
    if n > chunk:
        random.Random(seed).shuffle(order)
    return order


class Built(NamedTuple):
    """What :func:`build_index_in_chunks` made: the index, ready to search, the tokens it holds, and the seconds
    each chunk took (the first includes fast-plaid's k-means; each update costs more as the index grows)."""

    index: PlaidSearch
    tokens: int
    chunk_seconds: list[float]


def time_left(done: int, total: int, last: int, last_seconds: float) -> float:
    """Seconds the ``total - done`` documents still to add will take at the pace of the last chunk (``last``
    documents in ``last_seconds``). After the first chunk the guess is high (that chunk paid for k-means); after
    an update it is low (each update costs a little more than the one before).

    >>> time_left(20_000, 100_000, 10_000, 300.0), time_left(10_000, 15_000, 10_000, 600.0)
    (2400.0, 300.0)
    """
    return (total - done) * last_seconds / last


def build_index_in_chunks(
    folder: Path,
    name: str,
    nbits: int,
    ids: list[str],
    texts: list[str],
    encode: Callable[[list[str]], list],
    seed: int,
    chunk: int,
) -> Built:
    """:func:`build_index` of ``texts``, encoded ``chunk`` documents at a time, so that the build holds one
    chunk's float embeddings beside the index, whatever the corpus's size. The first chunk creates the index
    (fast-plaid's k-means centroids come from its tokens: give it a representative chunk); each later one is
    fast-plaid's update, which compresses it against those centroids and adds centroids where its tokens fall far
    from all of them. fast-plaid's ``low_memory`` keeps the index's codes and residuals in host memory on a GPU
    while it builds. A corpus of several chunks logs a line a chunk, with the time left."""
    from pylate import indexes

    index = indexes.PLAID(
        index_folder=str(folder), index_name=name, override=True, nbits=nbits, show_progress=False, low_memory=True
    )
    tokens, seconds = 0, []
    quiet = logging.getLogger("pylate.indexes.fast_plaid")  # its warning at every update: adding chunks is the plan
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            for start in range(0, len(texts), chunk):
                started = time.perf_counter()
                docs = encode(texts[start : start + chunk])  # each (tokens, dim)
                tokens += sum(len(d) for d in docs)
                index.add_documents(documents_ids=ids[start : start + chunk], documents_embeddings=docs)
                del docs
                seconds.append(time.perf_counter() - started)
                if len(texts) > chunk:
                    done = min(start + chunk, len(texts))
                    log.info(
                        "index %s: %d of %d documents added in %.0fs (this chunk %.0fs); about %.0f min left",
                        name,
                        done,
                        len(texts),
                        sum(seconds),
                        seconds[-1],
                        time_left(done, len(texts), done - start, seconds[-1]) / 60,
                    )
    finally:
        quiet.setLevel(level)
    del index
    return Built(PlaidSearch(Path(folder) / name / FAST_PLAID_DIR, ids), tokens, [round(t, 1) for t in seconds])


class PlaidRetriever:
    """Beyond what exact MaxSim holds in memory (about 1M documents on GPUs, an estimate): each rank
    builds a PLAID index (PyLate's fast-plaid) of its share of the corpus, the same fixed chunks as
    :class:`ModelRetriever`, answers every query from it, and the per-rank top-k lists are merged. The share is
    encoded and added a chunk at a time, as the index phase's corpus is (``trainer/index.py``).

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
            order = [self.ids[i] for i in chunk_order(len(self.ids), ENCODE_CHUNK, seed)]

            def encode(texts: list[str]) -> list:
                return model.encode(texts, is_query=False, batch_size=batch_size, show_progress_bar=show)

            ids, texts = [str(i) for i in order], [corpus[i] for i in order]
            self.index = build_index_in_chunks(
                folder, f"rank-{D.rank()}", nbits, ids, texts, encode, seed, ENCODE_CHUNK
            ).index

    @torch.no_grad()
    def search(self, queries: list[str], positives: list[set[int]], k: int) -> tuple[list[Candidates], list[dict]]:
        from pylate.scores import colbert_scores

        keep = k + max(len(p) for p in positives)
        found: list[Candidates] = [[] for _ in queries]
        if self.index is not None:
            q = self.model.encode(queries, is_query=True, batch_size=self.batch_size, show_progress_bar=False)
            for qi, hits in enumerate(self.index.search(q, min(keep, len(self.ids)))):
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
            scores = colbert_scores(q_emb, own_columns(d_emb, d_mask)).cpu()  # as the exact retriever scores
            column = {p: j for j, p in enumerate(held)}
            for qi, pos in enumerate(positives):
                positive_scores[qi].update({p: float(scores[qi, column[p]]) for p in pos if p in column})
        values = [[v for _, v in f] for f in found]
        ids = [[i for i, _ in f] for f in found]
        return merge_shards(D.gather_objects((values, ids, positive_scores)), keep)
