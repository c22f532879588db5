"""The job's last phase (``index:`` in the config): a PLAID index of a corpus, built with the trained
model (its documents pooled to about 1/``index.pool_factor`` of their tokens by PyLate's hierarchical pooling),
and retrieval through it evaluated next to exact MaxSim.

It runs on rank 0 after the process group is gone, so a long index build never holds other ranks in a
collective (they have finished). The index is PyLate's ``PLAID`` with the ``fast-plaid`` backend, built
and searched as mining's PLAID retriever does (``trainer/retrieval/plaid.py``), written to
``output_dir/index`` (built under a temporary name, its manifest last, then renamed; a failed build leaves
nothing, a full disk is one line), with ``corpus-ids.json``, the document of each PLAID id, which serving
holds in memory; ``metrics.json`` gains ``index``: the metrics through the index, its build seconds and size
on disk. With ``index.embeddings``, the corpus's token embeddings are stored beside it for
``serve --exact`` (``trainer/serve/corpus.py``).

The corpus is encoded and added to the index ``ENCODE_CHUNK`` documents at a time (``trainer/retrieval/plaid.py``:
fast-plaid's create, then its update), so the build's memory is the index and one chunk's embeddings, not the
whole corpus's (about 90 KB a 180-token document in float32). A corpus of more than one chunk is added in a seeded
random order, so the first chunk, whose tokens train the centroids, is a sample of the whole corpus rather than
its first documents; ``corpus-ids.json`` holds that order.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from trainer.config.schema import METRICS, TrainConfig

__all__ = ["build_and_evaluate"]

log = logging.getLogger(__name__)


def _size_mb(path: Path) -> float:
    return round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20, 2)


def build_and_evaluate(model_dir: str, cfg: TrainConfig) -> dict:
    """Index ``cfg.index.corpus`` (default ``data.eval_beir``) with the final model; evaluate through it."""
    from pylate import models

    from trainer.atomic import replace_dir, whole_or_absent
    from trainer.evaluate import TOP_K, load_beir, retrieval_metrics
    from trainer.retrieval import plaid
    from trainer.run.checkpoint import write_manifest
    from trainer.serve.corpus import IDS

    corpus = cfg.index.corpus or cfg.data.eval_beir
    split = load_beir(corpus, cfg.data.eval_split)
    model = models.ColBERT(model_dir, query_length=cfg.model.query_length, document_length=cfg.model.document_length)
    out = Path(cfg.output_dir)
    tmp = out / f".tmp-index-{os.getpid()}"
    started = time.perf_counter()
    with whole_or_absent(tmp):  # a failed build leaves no temporary; a full disk is DiskFull's one line
        order = plaid.chunk_order(len(split.corpus), plaid.ENCODE_CHUNK, cfg.training.seed)
        ids, texts = [split.corpus_ids[i] for i in order], [split.corpus[i] for i in order]

        def encode(chunk: list[str]) -> list:
            return model.encode(
                chunk,
                is_query=False,
                batch_size=cfg.evaluation.batch_size,
                pool_factor=cfg.index.pool_factor,  # PyLate's hierarchical token pooling (1: none)
                show_progress_bar=False,
            )

        built = plaid.build_index_in_chunks(
            tmp, "colbert", cfg.index.nbits, ids, texts, encode, cfg.training.seed, plaid.ENCODE_CHUNK
        )
        index = built.index
        build_seconds = time.perf_counter() - started
        queries = model.encode(
            split.queries, is_query=True, batch_size=cfg.evaluation.batch_size, show_progress_bar=False
        )
        hits = index.search(queries, min(TOP_K, len(split.corpus_ids)))
        run = {qid: dict(found) for qid, found in zip(split.query_ids, hits)}
        del index
        (tmp / IDS).write_text(json.dumps(ids))  # each PLAID id's document, for serving
        if cfg.index.embeddings:  # for serve --exact (trainer/serve/corpus.py): the evaluation's embeddings
            from trainer.serve.corpus import write_corpus

            write_corpus(tmp, model, texts, cfg.evaluation.batch_size)  # in corpus-ids.json's order
        write_manifest(tmp)  # last: an index without a verifying manifest is rebuilt (trainer/phases.py)
    replace_dir(tmp, out / "index")
    result = {
        **retrieval_metrics(run, {q: split.qrels[q] for q in split.query_ids}),
        "build_seconds": round(build_seconds, 2),
        "size_mb": _size_mb(out / "index"),
        "documents": len(split.corpus_ids),
        "nbits": cfg.index.nbits,
        "pool_factor": cfg.index.pool_factor,
        "tokens_per_document": round(built.tokens / len(split.corpus_ids), 2),  # after pooling: what it holds
        "chunk_seconds": built.chunk_seconds,  # encoded and added a chunk at a time (plaid.ENCODE_CHUNK documents)
        "path": str(out / "index"),  # as output_dir gives it: metrics.json holds no absolute local path
    }
    log.info(
        "PLAID index of %d documents built in %.1fs (%.1f MiB): %s",
        result["documents"],
        build_seconds,
        result["size_mb"],
        " ".join(f"{k}={result[k]:.4f}" for k in METRICS),
    )
    return result
