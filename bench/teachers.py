"""Is any teacher available offline stronger than the student it would teach? Held-out nDCG@10 of each.

    python bench/teachers.py --record lab/teachers/results.jsonl

Distillation (``mine.teacher``) can only lift a student towards its teacher, so a teacher is worth its
cost when it retrieves better than the student does after the same training. This scores, on each
benchmark's held-out split (the same queries and corpus ``bench/mining_quality.py`` evaluates on), every
scorer this machine has without a model hub:

* ``bm25``: BM25 through mining's own retriever (``trainer/retrieval/: Bm25Retriever``, ``bm25s``);
* ``dense``: all-MiniLM-L6-v2 as the bi-encoder it was trained as (mean pooling, cosine);
* ``bm25+dense``: the two fused by reciprocal rank (k = 60), the usual hybrid;
* ``colbert-base``: all-MiniLM-L6-v2 as ColBERT with a new projection (what ``model-3`` mines with),
  one seed per projection, scored by the trainer's own evaluation (exact MaxSim).

Next to them it prints the students, read from ``lab/mining-quality/results.jsonl``: the trained
ColBERT models those teachers would have to beat.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, git_commit, minilm
from bench.mining_quality import benchmark
from lab.record import mining_quality_runs, put_named

DOCUMENT_LENGTH = {"quickstart": 128, "packages": 64}  # as bench/mining_quality.py trains and scores them
STUDENTS = {  # the trained arms shown as students: (protocol in lab/mining-quality/results.jsonl, arm)
    "quickstart": [("quickstart-26", "bm25-1"), ("quickstart-26", "model-3")],
    "packages": [
        ("packages-84", "bm25-1"),
        ("packages-84", "model-3"),
        ("packages-252", "bm25-1-k1000"),
        ("packages-252", "model-3-k1000"),
    ],
}
TOP_K = 100


def rrf(runs: list[dict[str, dict[str, float]]], k: int = 60) -> dict[str, dict[str, float]]:
    """Reciprocal-rank fusion: each document scores the sum of 1 / (k + rank) over the runs that hold it."""
    fused: dict[str, dict[str, float]] = {}
    for run in runs:
        for qid, scored in run.items():
            acc = fused.setdefault(qid, {})
            for rank, doc in enumerate(sorted(scored, key=lambda d: -scored[d]), 1):
                acc[doc] = acc.get(doc, 0.0) + 1.0 / (k + rank)
    return fused


def scorers(name: str, seeds: list[int]) -> dict[str, list[float]]:
    """nDCG@10 of each offline scorer on ``name``'s held-out split (a list: one value per seed where a seed
    matters)."""
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from trainer.config.schema import ModelConfig
    from trainer.evaluate import evaluate, load_beir, retrieval_metrics
    from trainer.model import build_model
    from trainer.retrieval.bm25 import Bm25Retriever

    split = load_beir(benchmark(name).parent / "beir")
    ids = split.corpus_ids
    found, _ = Bm25Retriever(split.corpus, show=False).search(split.queries, [set() for _ in split.queries], TOP_K)
    bm25 = {q: {ids[d]: s for d, s in hits} for q, hits in zip(split.query_ids, found)}
    dense_model = SentenceTransformer(minilm(), device="cpu")
    docs = dense_model.encode(split.corpus, normalize_embeddings=True, batch_size=64)
    scores = dense_model.encode(split.queries, normalize_embeddings=True) @ docs.T
    top = np.argsort(-scores, axis=1)[:, :TOP_K]
    dense = {q: {ids[d]: float(scores[i, d]) for d in top[i]} for i, q in enumerate(split.query_ids)}
    out = {
        "bm25": [retrieval_metrics(bm25, split.qrels)["ndcg@10"]],
        "dense": [retrieval_metrics(dense, split.qrels)["ndcg@10"]],
        "bm25+dense": [retrieval_metrics(rrf([bm25, dense]), split.qrels)["ndcg@10"]],
        "colbert-base": [],
    }
    cfg = ModelConfig(name_or_path=minilm(), query_length=32, document_length=DOCUMENT_LENGTH[name])
    for seed in seeds:
        torch.manual_seed(seed)  # the new projection's initial weights, as a training run of this seed draws them
        out["colbert-base"].append(evaluate(build_model(cfg, "cpu"), split)["ndcg@10"])
    return out


def students(name: str) -> dict[str, list[float]]:
    """Held-out nDCG@10 per seed of the trained arms named in STUDENTS, from the research record."""
    recorded, out = mining_quality_runs(ROOT / "lab" / "mining-quality" / "results.jsonl"), {}
    for protocol, arm in STUDENTS[name]:
        if protocol in recorded and arm in recorded[protocol][1]:
            head, runs = recorded[protocol]
            out[f"{arm}, {head['steps']} steps"] = [r["ndcg@10"] for r in runs[arm].values()]
    return out


def table(result: dict) -> str:
    lines = ["| benchmark | scorer | role | nDCG@10 (mean ± std over seeds) |", "|---|---|---|---|"]
    for name, r in result["benchmarks"].items():
        for role, rows in (("teacher candidate", r["teachers"]), ("trained student", r["students"])):
            for scorer, values in rows.items():
                spread = f" ± {statistics.stdev(values):.4f} ({len(values)} seeds)" if len(values) > 1 else ""
                lines.append(f"| {name} | {scorer} | {role} | {statistics.mean(values):.4f}{spread} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", choices=list(DOCUMENT_LENGTH), default=list(DOCUMENT_LENGTH))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", type=Path, help="write the result here as JSON")
    parser.add_argument("--record", type=Path, help="merge it into the study's record: lab/teachers/results.jsonl")
    args = parser.parse_args()
    result = {
        "commit": git_commit(),
        "benchmarks": {name: {"teachers": scorers(name, args.seeds), "students": students(name)} for name in args.data},
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, b in result["benchmarks"].items() if args.record else ():  # a line per benchmark
        put_named(args.record, "teachers", name, {"commit": result["commit"], **b})
    print(table(result))


if __name__ == "__main__":
    main()
