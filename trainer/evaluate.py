"""Retrieval quality on a BEIR directory with exact MaxSim scoring (no index, no approximation).

The search is mining's exact retriever (``trainer/retrieval/exact.py``, one search for mining, evaluation
and the teacher): every rank encodes its fixed chunks of the corpus as it scores them (memory bounded by a
chunk, not the corpus), keeps a running top 100 per query, and the small top lists are gathered and merged.
No rank idles in a collective while another evaluates, so evaluation cannot trip the process-group timeout;
and the metrics, identical on every rank, do not depend on the world size (the merge keeps the exact top 100,
ties to the lower document index).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from trainer.config.schema import METRICS, ConfigError
from trainer.data import DataError, document_text, iter_jsonl, text_field

TOP_K = 100

__all__ = ["BeirSplit", "evaluate", "load_beir", "load_queries", "retrieval_metrics", "search", "trec_order"]


@dataclass
class BeirSplit:
    corpus_ids: list[str]
    corpus: list[str]
    query_ids: list[str]
    queries: list[str]
    qrels: dict[str, dict[str, int]]


def _jsonl(path: Path) -> list[tuple[str, dict]]:
    if not path.is_file():
        raise ConfigError(f"BEIR file not found: {path} (data.eval_beir needs corpus.jsonl, queries.jsonl, qrels/)")
    return list(iter_jsonl(path))


def _id(value: dict, where: str) -> str:
    """BEIR ids are strings; some sets write numbers, which qrels (text) name the same way."""
    found = value.get("_id") if isinstance(value, dict) else None
    if isinstance(found, bool) or not isinstance(found, (str, int)) or not str(found).strip():
        raise DataError(f"{where}: needs an '_id' (a string)")
    return str(found)


def load_beir(root: str | Path, split: str = "test") -> BeirSplit:
    root = Path(root)
    ids, texts, seen = [], [], set()
    for where, d in _jsonl(root / "corpus.jsonl"):
        doc_id = _id(d, where)
        if doc_id in seen:
            raise DataError(f"{where}: _id {doc_id[:80]!r} appears more than once; ids must be unique")
        seen.add(doc_id)
        ids.append(doc_id)
        texts.append(document_text(d, where))
    if not ids:
        raise DataError(f"{root / 'corpus.jsonl'}: holds no document")
    return BeirSplit(ids, texts, *load_queries(root, split))


def load_queries(root: str | Path, split: str = "test") -> tuple[list[str], list[str], dict[str, dict[str, int]]]:
    """A BEIR directory's judged queries of ``split``: (ids, texts, qrels), without reading its corpus."""
    root = Path(root)
    queries = {_id(q, where): text_field(q, "text", where) for where, q in _jsonl(root / "queries.jsonl")}
    qrels_path = root / "qrels" / f"{split}.tsv"
    if not qrels_path.is_file():
        raise ConfigError(f"BEIR qrels not found: {qrels_path} (set data.eval_split)")
    qrels = _read_qrels(qrels_path)
    qids = [q for q in qrels if q in queries]
    if not qids:
        raise ConfigError(f"{qrels_path}: no query in qrels appears in queries.jsonl")
    return qids, [queries[q] for q in qids], qrels


def _read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """BEIR's qrels: a tab-separated header ``query-id corpus-id score``, then one judgement per line."""
    qrels: dict[str, dict[str, int]] = {}
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f, delimiter="\t")
            header = next(reader, [])
            if header[:3] != ["query-id", "corpus-id", "score"]:
                raise DataError(
                    f"{path}: the first line must be the header query-id<TAB>corpus-id<TAB>score, "
                    f"got {chr(9).join(header)[:80]!r}"
                )
            for n, row in enumerate(reader, start=2):
                if not row:
                    continue
                if len(row) < 3 or not row[2].strip().lstrip("-").isdigit():
                    raise DataError(f"{path} line {n}: needs query-id, corpus-id and an integer score, tab-separated")
                if int(row[2]) > 0:
                    qrels.setdefault(row[0], {})[row[1]] = int(row[2])
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start}); save the file as UTF-8") from None
    return qrels


def trec_order(scored: dict[str, float]) -> list[str]:
    """trec_eval's ranking of a run: decreasing score, ties by decreasing document id."""
    return [d for d, _ in sorted(scored.items(), key=lambda item: (item[1], item[0]), reverse=True)]


def retrieval_metrics(run: dict[str, dict[str, float]], qrels: dict[str, dict[str, int]]) -> dict[str, float]:
    """nDCG@10, MRR@10, Recall@100 and MAP@100 with trec_eval's definitions, averaged over the queries
    of ``qrels``: the gain is the relevance level itself (``ndcg_cut``, linear, as in BEIR's tables),
    a document is relevant at level >= 1, ties in score are broken by document id as trec_eval does,
    and a query missing from ``run`` scores 0."""
    totals = dict.fromkeys(METRICS, 0.0)
    for qid, judged in qrels.items():
        ranked = trec_order(run.get(qid, {}))[:100]
        relevant = {d for d, r in judged.items() if r >= 1}
        dcg = sum(max(judged.get(d, 0), 0) / math.log2(i + 2) for i, d in enumerate(ranked[:10]))
        ideal = sorted((r for r in judged.values() if r > 0), reverse=True)[:10]
        idcg = sum(r / math.log2(i + 2) for i, r in enumerate(ideal))
        totals["ndcg@10"] += dcg / idcg if idcg else 0.0
        totals["mrr@10"] += next((1.0 / (i + 1) for i, d in enumerate(ranked[:10]) if d in relevant), 0.0)
        totals["recall@100"] += len(set(ranked) & relevant) / len(relevant) if relevant else 0.0
        hits, precision_sum = 0, 0.0
        for i, d in enumerate(ranked):
            if d in relevant:
                hits += 1
                precision_sum += hits / (i + 1)
        totals["map@100"] += precision_sum / len(relevant) if relevant else 0.0
    n = max(1, len(qrels))
    return {k: v / n for k, v in totals.items()}


def evaluate(model, split: BeirSplit, batch_size: int = 32) -> dict[str, float]:
    """Exact MaxSim retrieval over the whole corpus, sharded over ranks; the same metrics on every rank."""
    return retrieval_metrics(search(model, split, batch_size), {q: split.qrels[q] for q in split.query_ids})


def search(model, split: BeirSplit, batch_size: int = 32) -> dict[str, dict[str, float]]:
    """The top 100 documents of every query by exact MaxSim, as a run ({query id: {document id: score}}):
    mining's own exact retriever (``trainer/retrieval/exact.py``), each chunk encoded as it is scored."""
    from trainer.retrieval.exact import ModelRetriever

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        retriever = ModelRetriever(model, split.corpus, batch_size, device, show=False, stored=False)
        found, _ = retriever.search(split.queries, [set() for _ in split.queries], TOP_K)
    finally:
        model.train(was_training)
    return run_of(split, found)


def run_of(split: BeirSplit, found: list) -> dict[str, dict[str, float]]:
    """A retriever's candidates for ``split``'s queries, in order, as a run: {query id: {document id: score}}."""
    return {qid: {split.corpus_ids[d]: s for d, s in top} for qid, top in zip(split.query_ids, found)}
