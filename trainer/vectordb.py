"""The corpus, encoded by the trained model, written into the user's vector database, and its search checked
against exact MaxSim (``vectordb:`` in the config; ``colbert-k8s export-index`` for a model already exported).

* **Streamed.** ``corpus.jsonl`` is read ``chunk_size`` rows at a time; each chunk is encoded with PyLate
  (``pool_factor`` as ``index.pool_factor`` chose), written, and scored exactly against the held-out queries
  (a running top 10), so memory is bounded by a chunk, not the corpus.
* **Written once.** A document's point is keyed by its id (Qdrant: ``uuid5`` of it; LanceDB: ``merge_insert`` on
  ``doc_id``); what is there already is not written again, so a restart after a kill resumes and a second
  run adds nothing.
* **Only into its own collection.** The collection carries a marker (the model's weights' and the corpus's
  sha256, the pool factor, the dimension). One without the marker (not made by this tool), or with another
  export's, is refused in one line unless ``replace`` (``vectordb.replace``, ``--replace``): then it is
  dropped and written anew. A collection with this very marker is this export's, resumed.
* **Checked.** After the write, each held-out query's top 10 from the database is compared with exact
  MaxSim's over the same vectors: the overlap at 10, the share of queries in the same order, the largest
  score difference, and nDCG@10 both ways (the database's ranking and exact MaxSim's, each against the
  qrels). ``metrics.json`` (``vectordb``) and the model card record them; a database that searches
  approximately shows it there.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from trainer.atomic import sha256_of
from trainer.data import DataError, document_text, iter_jsonl
from trainer.destinations.base import ExportError
from trainer.destinations.claim import claim
from trainer.destinations.vectors import VectorTarget, database, parse_vector_url
from trainer.evaluate import load_queries, retrieval_metrics
from trainer.retrieval.exact import maxsim
from trainer.retrieval.search import TopK

__all__ = ["PARITY_K", "corpus_chunks", "export_corpus", "export_index", "fingerprint", "for_job"]

log = logging.getLogger("trainer")

PARITY_K = 10  # the depth the database's answers are compared with exact MaxSim's at


def fingerprint(model_dir: Path) -> str:
    """The sha256 of a model's weights (its ``*.safetensors``/``*.bin`` files), which the marker names: the
    same weights, the same fingerprint, wherever the model was copied to."""
    skip = {"index", "best-model", "checkpoint", "checkpoints"}
    weights = sorted(
        p
        for p in Path(model_dir).rglob("*")
        if p.suffix in (".safetensors", ".bin") and p.is_file() and not skip & set(p.relative_to(model_dir).parts)
    )
    if not weights:
        raise ExportError(f"{model_dir} holds no weights (*.safetensors); give a PyLate model directory")
    digest = hashlib.sha256()
    for p in weights:
        digest.update(f"{p.relative_to(model_dir).as_posix()}\0{sha256_of(p)}\n".encode())
    return digest.hexdigest()


def corpus_chunks(path: Path, size: int) -> Iterator[tuple[list[str], list[str], list[dict]]]:
    """(ids, texts as they are encoded, the rows' other fields) of each ``size`` rows of a BEIR
    ``corpus.jsonl``, read as they come; a row without ``_id`` or text, or an id seen before, is one line."""
    seen: set[str] = set()
    ids, texts, fields = [], [], []
    for where, row in iter_jsonl(path):
        doc = row.get("_id") if isinstance(row, dict) else None
        if isinstance(doc, bool) or not isinstance(doc, (str, int)) or not str(doc).strip():
            raise DataError(f"{where}: needs an '_id' (a string)")
        doc = str(doc)
        if doc in seen:
            raise DataError(f"{where}: _id {doc[:80]!r} appears more than once; ids must be unique")
        seen.add(doc)
        ids.append(doc)
        texts.append(document_text(row, where))
        fields.append({k: v for k, v in row.items() if k != "_id"})
        if len(ids) == size:
            yield ids, texts, fields
            ids, texts, fields = [], [], []
    if ids:
        yield ids, texts, fields
    if not seen:
        raise DataError(f"{path}: holds no document")


@torch.no_grad()
def export_corpus(
    model,
    corpus: Path,
    target: VectorTarget,
    model_id: str,
    *,
    queries: Path | None = None,
    split: str = "test",
    pool_factor: int = 1,
    replace: bool = False,
    chunk_size: int = 512,
    batch_size: int = 32,
) -> dict:
    """Encode ``corpus`` (a BEIR ``corpus.jsonl``) with ``model``, write it into ``target``, and compare the
    database's top 10 for the judged queries of ``queries`` (a BEIR directory; None: no check) with exact
    MaxSim's over the same vectors. ``model_id``: the weights' :func:`fingerprint`. Returns the figures."""
    started = time.perf_counter()
    device = next(model.parameters()).device
    model.eval()
    dim = int(model.encode(["dimension"], is_query=False, show_progress_bar=False)[0].shape[-1])
    marker = {"model": model_id, "corpus": sha256_of(corpus), "pool_factor": pool_factor, "dim": dim}
    held = load_queries(queries, split) if queries is not None else None
    q_emb = None
    if held is not None:
        encoded = model.encode(held[1], is_query=True, batch_size=batch_size, show_progress_bar=False)
        q_emb = torch.stack([torch.as_tensor(q) for q in encoded]).to(device)  # (queries, query tokens, dim)
    db = database(target)
    try:
        state = claim(db, target, marker, replace)
        log.info("vectordb: %s %s (%s)", target.container, target, state)
        best = TopK([set() for _ in held[0]], PARITY_K) if held else None
        ids: list[str] = []
        documents = written = tokens = 0
        for chunk_ids, texts, fields in corpus_chunks(corpus, chunk_size):
            embedded = model.encode(
                texts, is_query=False, batch_size=batch_size, pool_factor=pool_factor, show_progress_bar=False
            )
            vectors = [torch.as_tensor(e, dtype=torch.float32) for e in embedded]  # each (its tokens, dim)
            written += db.write(chunk_ids, [v.numpy() for v in vectors], fields)
            if best is not None:
                best.add(documents, maxsim(q_emb, vectors).cpu())
                ids += chunk_ids
            documents += len(chunk_ids)
            tokens += sum(len(v) for v in vectors)
            log.info("vectordb: %d documents encoded, %d written", documents, written)
        result = {
            "destination": str(target),
            "state": state,
            "documents": documents,
            "written": written,
            "already_there": documents - written,
            "points": db.count(),
            "pool_factor": pool_factor,
            "dim": dim,
            "tokens_per_document": round(tokens / documents, 2),
            "vector_bytes_per_document": round(4 * dim * tokens / documents),  # float32, as the database holds them
        }
        if best is not None:
            exact = [[(ids[i], float(v)) for v, i in zip(vals, idx)] for vals, idx in zip(best.values, best.ids)]
            result["parity"] = parity(db, held, q_emb.cpu(), exact)
    finally:
        db.close()
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def parity(db, held: tuple, q_emb: torch.Tensor, exact: list[list[tuple[str, float]]]) -> dict:
    """The database's top 10 per query against exact MaxSim's: overlap, order, scores, nDCG@10 both ways."""
    qids, _, qrels = held
    found = [db.search(q.numpy(), PARITY_K) for q in q_emb]
    overlap = same = 0.0
    worst = 0.0
    for got, want in zip(found, exact):
        depth = max(1, min(PARITY_K, len(want)))
        overlap += len({d for d, _ in got} & {d for d, _ in want}) / depth
        same += [d for d, _ in got] == [d for d, _ in want]
        scores = dict(want)
        worst = max([worst, *(abs(s - scores[d]) for d, s in got if d in scores)])
    judged = {q: qrels[q] for q in qids}
    runs = {"database": found, "exact": exact}
    ndcg = {k: retrieval_metrics({q: dict(r) for q, r in zip(qids, run)}, judged)["ndcg@10"] for k, run in runs.items()}
    n = max(1, len(qids))
    return {
        "queries": len(qids),
        "overlap@10": round(overlap / n, 4),
        "same_order": round(same / n, 4),
        "max_score_difference": round(worst, 5),
        "ndcg@10_database": round(ndcg["database"], 4),
        "ndcg@10_exact": round(ndcg["exact"], 4),
    }


def _corpus_dir(cfg) -> Path:
    return Path(cfg.index.corpus if cfg.index is not None and cfg.index.corpus else cfg.data.eval_beir)


def _judged(root: Path, split: str) -> Path | None:
    """``root`` when it holds judged queries of ``split`` (the parity check's), else None (no check, logged)."""
    if (root / "queries.jsonl").is_file() and (root / "qrels" / f"{split}.tsv").is_file():
        return root
    log.info("vectordb: %s holds no queries.jsonl and qrels/%s.tsv: no check against exact MaxSim", root, split)
    return None


def for_job(model_dir: str, cfg) -> dict:
    """The job's phase (rank 0, after the index): the final model's encoding of the index's corpus."""
    from pylate import models

    model = models.ColBERT(model_dir, query_length=cfg.model.query_length, document_length=cfg.model.document_length)
    root = _corpus_dir(cfg)
    return export_corpus(
        model,
        root / "corpus.jsonl",
        parse_vector_url(cfg.vectordb.destination),
        fingerprint(Path(model_dir)),
        queries=_judged(root, cfg.data.eval_split),
        split=cfg.data.eval_split,
        pool_factor=cfg.index.pool_factor if cfg.index is not None else 1,
        replace=cfg.vectordb.replace,
        chunk_size=cfg.vectordb.chunk_size,
        batch_size=cfg.evaluation.batch_size,
    )


def _chosen_pool_factor(model_dir: Path) -> int:
    """The pool factor the job chose (``index.pool_factor``, in its ``metrics.json`` beside the model), else 1."""
    import json

    for where in (model_dir / "metrics.json", model_dir.parent / "metrics.json"):
        try:
            found = json.loads(where.read_text()).get("index", {}).get("pool_factor")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(found, int) and found >= 1:
            return found
    return 1


def export_index(
    uri: str,
    corpus: Path,
    to: str,
    *,
    queries: Path | None = None,
    split: str = "test",
    pool_factor: int | None = None,
    replace: bool = False,
    chunk_size: int = 512,
    batch_size: int = 32,
    device: str | None = None,
    cache_dir: str = ".cache/colbert-k8s",
) -> dict:
    """``colbert-k8s export-index``: a model already exported (a directory, a job's ``output_dir``, or an export
    on ``s3://``/``gs://``/``az://``, checked against its manifest as ``serve`` checks it) encodes ``corpus`` (a
    BEIR directory or its ``corpus.jsonl``) into ``to``. ``queries``: a BEIR directory whose judged queries
    check the database against exact MaxSim (default: the corpus's directory when it holds queries and qrels).
    ``pool_factor``: default the job's ``index.pool_factor`` (its ``metrics.json``), else 1."""
    from pylate import models

    from trainer.serve.engine import locate

    target = parse_vector_url(to)
    corpus = Path(corpus)
    corpus_file = corpus / "corpus.jsonl" if corpus.is_dir() else corpus
    if not corpus_file.is_file():
        raise ExportError(f"--corpus {corpus}: no corpus.jsonl there; give a BEIR directory or its corpus.jsonl")
    queries = queries if queries is not None else _judged(corpus_file.parent, split)
    model_dir, _ = locate(uri, cache_dir)
    pool_factor = pool_factor or _chosen_pool_factor(model_dir)
    model = models.ColBERT(str(model_dir), device=device)
    return export_corpus(
        model,
        corpus_file,
        target,
        fingerprint(model_dir),
        queries=queries,
        split=split,
        pool_factor=pool_factor,
        replace=replace,
        chunk_size=chunk_size,
        batch_size=batch_size,
    )
