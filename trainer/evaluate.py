"""Retrieval quality on a BEIR directory with exact MaxSim scoring (no index, no approximation).

Run on rank 0 only: the other ranks wait at a barrier, so metrics are computed once, not W times.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from pylate.scores import colbert_scores

from trainer.config import ConfigError
from trainer.encode import encode

__all__ = ["BeirSplit", "load_beir", "evaluate", "retrieval_metrics"]


@dataclass
class BeirSplit:
    corpus_ids: list[str]
    corpus: list[str]
    query_ids: list[str]
    queries: list[str]
    qrels: dict[str, dict[str, int]]


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise ConfigError(f"BEIR file not found: {path} (data.eval_beir needs corpus.jsonl, queries.jsonl, qrels/)")
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_beir(root: str | Path, split: str = "test") -> BeirSplit:
    root = Path(root)
    corpus = _jsonl(root / "corpus.jsonl")
    queries = {q["_id"]: q["text"] for q in _jsonl(root / "queries.jsonl")}
    qrels_path = root / "qrels" / f"{split}.tsv"
    if not qrels_path.is_file():
        raise ConfigError(f"BEIR qrels not found: {qrels_path} (set data.eval_split)")
    qrels: dict[str, dict[str, int]] = {}
    with qrels_path.open(encoding="utf-8") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            if int(row["score"]) > 0:
                qrels.setdefault(row["query-id"], {})[row["corpus-id"]] = int(row["score"])
    qids = [q for q in qrels if q in queries]
    if not qids:
        raise ConfigError(f"{qrels_path}: no query in qrels appears in queries.jsonl")
    texts = [((d.get("title") or "") + " " + d["text"]).strip() for d in corpus]
    return BeirSplit([d["_id"] for d in corpus], texts, qids, [queries[q] for q in qids], qrels)


def retrieval_metrics(
    ranked: list[list[str]], query_ids: list[str], qrels: dict[str, dict[str, int]]
) -> dict[str, float]:
    """nDCG@10, MRR@10 and Recall@100, averaged over queries."""
    ndcg = mrr = recall = 0.0
    for qid, docs in zip(query_ids, ranked):
        rel = qrels[qid]
        dcg = sum((2 ** rel.get(d, 0) - 1) / math.log2(i + 2) for i, d in enumerate(docs[:10]))
        ideal = sorted(rel.values(), reverse=True)[:10]
        idcg = sum((2**r - 1) / math.log2(i + 2) for i, r in enumerate(ideal))
        ndcg += dcg / idcg if idcg else 0.0
        mrr += next((1.0 / (i + 1) for i, d in enumerate(docs[:10]) if d in rel), 0.0)
        recall += len(set(docs[:100]) & set(rel)) / len(rel)
    n = len(query_ids)
    return {"ndcg@10": ndcg / n, "mrr@10": mrr / n, "recall@100": recall / n}


@torch.no_grad()
def _embed(
    model, texts: list[str], is_query: bool, batch_size: int, length: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    embs, masks = [], []
    for i in range(0, len(texts), batch_size):
        feats = {k: v.to(device) for k, v in model.tokenize(texts[i : i + batch_size], is_query=is_query).items()}
        enc = encode(model, feats, is_query, length)
        embs.append(enc.embeddings.float().cpu())
        masks.append(enc.mask.cpu())
    return torch.cat(embs), torch.cat(masks)


def evaluate(model, split: BeirSplit, batch_size: int = 32) -> dict[str, float]:
    """Score every query against every document exactly and compute the metrics."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        d_emb, d_mask = _embed(model, split.corpus, False, batch_size, model.document_length, device)
        q_emb, _ = _embed(model, split.queries, True, batch_size, model.query_length, device)
        ranked = []
        for i in range(0, len(q_emb), 64):
            scores = colbert_scores(q_emb[i : i + 64], d_emb, documents_mask=d_mask.float())  # (q, n_docs)
            top = scores.topk(min(100, scores.shape[1]), dim=1).indices
            ranked += [[split.corpus_ids[j] for j in row] for row in top.tolist()]
    finally:
        model.train(was_training)
    return retrieval_metrics(ranked, split.query_ids, split.qrels)
