"""What the index costs, measured where the model is made (``index.footprint: true``): on the held-out split,
nDCG@10 and Recall@100 against bytes and tokens per document, for token pooling (PyLate's hierarchical
pooling, pool factors 1, 2 and 3) and each stored form of the vectors: float32 as a vector database holds
them (searched by exact MaxSim), and PLAID at 4 and 2 bits (``index.nbits``).

Each PLAID point is a real index build (``trainer/retrieval/plaid.py``, seeded) in a temporary folder, its
bytes those of the index (codes, residuals, centroids, inverted lists: on a small corpus the centroids weigh
much), its bytes on disk beside them (:func:`_sizes` says what fast-plaid adds there); float32's bytes are
``4 x dim x tokens``. The figures go into ``metrics.json`` (``footprint``), the card (a table and one
line per trade, e.g. "at pool factor 2, 47% of the bytes for -0.004 nDCG@10") and ``footprint.png`` beside
the model. The chosen point, ``index.pool_factor`` and ``index.nbits``, is the one the final index was built
at; ``colbert-k8s tune --param index.pool_factor=choice(1,2)`` sweeps it.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import torch

from trainer.config.schema import TrainConfig
from trainer.evaluate import TOP_K, load_beir, retrieval_metrics
from trainer.retrieval.search import DOC_CHUNK, TopK

__all__ = ["NBITS", "POOL_FACTORS", "PNG", "measure", "trade_lines"]

log = logging.getLogger("trainer")

POOL_FACTORS = (1, 2, 3)
NBITS = (4, 2)
PNG = "footprint.png"


def _sizes(folder: Path) -> tuple[int, int]:
    """(the index's bytes, its bytes on disk). The index: its codes, residuals, centroids, inverted lists and
    id maps, each once. On disk fast-plaid also keeps ``embeddings.npy``, a float16 copy of every vector kept
    while an index has under 1,000 documents (to rebuild it on an update), and ``merged_*.npy``, one file of
    its chunks' codes and residuals made when it is loaded: neither grows with a large corpus's compression."""
    files = [p for p in folder.rglob("*") if p.is_file()]
    disk = sum(p.stat().st_size for p in files)
    extra = sum(p.stat().st_size for p in files if p.name == "embeddings.npy" or p.name.startswith("merged_"))
    return disk - extra, disk


@torch.no_grad()
def _exact(queries: torch.Tensor, docs: list[torch.Tensor], ids: list[str], qids: list[str]) -> dict:
    """Exact MaxSim of every query against the documents' (pooled) vectors, chunk by chunk: the run."""
    from trainer.retrieval.exact import maxsim

    best = TopK([set() for _ in qids], TOP_K)
    for start in range(0, len(docs), DOC_CHUNK):
        best.add(start, maxsim(queries, docs[start : start + DOC_CHUNK]))
    return {q: {ids[i]: float(v) for v, i in zip(vals, idx)} for q, vals, idx in zip(qids, best.values, best.ids)}


def measure(model_dir: Path, cfg: TrainConfig) -> dict:
    """Every (pool factor, storage) point on the held-out split; ``footprint.png`` drawn into ``model_dir``."""
    from pylate import models

    from trainer.retrieval.plaid import build_index

    split = load_beir(cfg.index.corpus or cfg.data.eval_beir, cfg.data.eval_split)
    model = models.ColBERT(
        str(model_dir), query_length=cfg.model.query_length, document_length=cfg.model.document_length
    )
    batch = cfg.evaluation.batch_size
    encoded = model.encode(split.queries, is_query=True, batch_size=batch, show_progress_bar=False)
    queries = torch.stack([torch.as_tensor(q) for q in encoded])  # (queries, query tokens, dim)
    judged = {q: split.qrels[q] for q in split.query_ids}
    n = len(split.corpus_ids)
    points = []
    for pool in POOL_FACTORS:
        vectors = model.encode(
            split.corpus, is_query=False, batch_size=batch, pool_factor=pool, show_progress_bar=False
        )
        docs = [torch.as_tensor(v, dtype=torch.float32) for v in vectors]  # each (its tokens, dim)
        tokens = sum(len(d) for d in docs) / n
        dim = docs[0].shape[-1]
        runs = {"float32": (_exact(queries, docs, split.corpus_ids, split.query_ids), 4 * dim * tokens, None)}
        for nbits in NBITS:
            folder = Path(tempfile.mkdtemp(prefix=".tmp-footprint-", dir=cfg.output_dir))  # a kill's: removed at start
            try:
                index = build_index(folder, "footprint", nbits, split.corpus_ids, docs, cfg.training.seed)
                hits = index.search(encoded, min(TOP_K, n))
                del index
                size, disk = _sizes(folder)
                runs[f"plaid {nbits}-bit"] = ({q: dict(h) for q, h in zip(split.query_ids, hits)}, size / n, disk / n)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        for storage, (run, size, disk) in runs.items():
            figures = retrieval_metrics(run, judged)
            points.append(
                {
                    "pool_factor": pool,
                    "storage": storage,
                    "tokens_per_document": round(tokens, 2),
                    "bytes_per_document": round(size),
                    "disk_bytes_per_document": round(disk if disk is not None else size),
                    "ndcg@10": round(figures["ndcg@10"], 4),
                    "recall@100": round(figures["recall@100"], 4),
                }
            )
        log.info("footprint: pool factor %d measured (%.1f tokens a document)", pool, tokens)
    chosen = {"pool_factor": cfg.index.pool_factor, "storage": f"plaid {cfg.index.nbits}-bit"}
    result = {"documents": n, "queries": len(split.query_ids), "chosen": chosen, "points": points}
    result["lines"] = trade_lines(points, f"plaid {cfg.index.nbits}-bit")
    result["png"] = _draw(points, model_dir / PNG)
    return result


def trade_lines(points: list[dict], storage: str) -> list[str]:
    """One line per trade against pool factor 1 at ``storage``, and against the other PLAID bit width.

    >>> p = [{"pool_factor": 1, "storage": "plaid 4-bit", "bytes_per_document": 1000, "ndcg@10": 0.5},
    ...      {"pool_factor": 2, "storage": "plaid 4-bit", "bytes_per_document": 470, "ndcg@10": 0.496},
    ...      {"pool_factor": 1, "storage": "plaid 2-bit", "bytes_per_document": 600, "ndcg@10": 0.49}]
    >>> trade_lines(p, "plaid 4-bit")
    ['at pool factor 2, 47% of the bytes for -0.004 nDCG@10', 'at plaid 2-bit, 60% of the bytes for -0.010 nDCG@10']
    """
    at = {(p["pool_factor"], p["storage"]): p for p in points}
    base = at.get((1, storage))
    if base is None or not base["bytes_per_document"]:
        return []
    trades = [(f"pool factor {pool}", p) for (pool, kind), p in sorted(at.items()) if kind == storage and pool > 1]
    trades += [
        (kind, p)
        for (pool, kind), p in sorted(at.items())
        if pool == 1 and kind.startswith("plaid") and kind != storage
    ]
    lines = []
    for what, p in trades:
        share = p["bytes_per_document"] / base["bytes_per_document"]
        lines.append(f"at {what}, {share:.0%} of the bytes for {p['ndcg@10'] - base['ndcg@10']:+.3f} nDCG@10")
    return lines


def _draw(points: list[dict], path: Path) -> str | None:
    """nDCG@10 against bytes per document, one line per storage through the pool factors; None (and one log
    line) where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        log.warning("footprint: %s not drawn (matplotlib is not installed); the figures are in metrics.json", PNG)
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for storage in dict.fromkeys(p["storage"] for p in points):
        mine = sorted((p for p in points if p["storage"] == storage), key=lambda p: p["pool_factor"])
        ax.plot([p["bytes_per_document"] for p in mine], [p["ndcg@10"] for p in mine], marker="o", label=storage)
        for p in mine:
            ax.annotate(f"pf {p['pool_factor']}", (p["bytes_per_document"], p["ndcg@10"]), fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("bytes per document (log)")
    ax.set_ylabel("nDCG@10 (held-out split)")
    ax.set_title("Index footprint against quality")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path.name
