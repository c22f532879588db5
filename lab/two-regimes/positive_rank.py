"""Where the base model (all-MiniLM-L6-v2 as a bi-encoder) ranks the labelled positive of a sample of a BEIR set's
training queries: the signal ``mine.rank_range: auto`` reads (trainer/rank_window.py), measured outside a job.

    python lab/two-regimes/positive_rank.py DATA_DIR sparse    # the query's first labelled positive, only it known
    python lab/two-regimes/positive_rank.py DATA_DIR full      # one at random, every labelled one known

Prints one line: labels per query, the positive's median rank among the documents not labelled for its query
(quartiles), the share ranked in the top 3, and how many of the top 30 score within 5% of it.
"""

from __future__ import annotations

import csv
import json
import random
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trainer.retrieval.dense import load_bi_encoder  # noqa: E402


def main(root: Path, labels: str, sample: int = 400) -> str:
    docs = [json.loads(line) for line in (root / "corpus.jsonl").open()]
    index = {d["_id"]: i for i, d in enumerate(docs)}
    texts = [f"{d.get('title', '')} {d['text']}".strip() for d in docs]
    queries = {q["_id"]: q["text"] for q in map(json.loads, (root / "queries.jsonl").open())}
    qrels: dict[str, list[str]] = {}
    with (root / "qrels" / "train.tsv").open() as f:
        for row in csv.DictReader(f, delimiter="\t"):
            if int(row["score"]) > 0:
                qrels.setdefault(row["query-id"], []).append(row["corpus-id"])
    rng = random.Random(0)
    qids = sorted(q for q in qrels if q in queries)
    rng.shuffle(qids)
    qids = qids[:sample]
    model = load_bi_encoder("sentence-transformers/all-MiniLM-L6-v2", "cpu")
    d = model.encode(texts, batch_size=64, convert_to_tensor=True, normalize_embeddings=True)
    q = model.encode([queries[x] for x in qids], batch_size=64, convert_to_tensor=True, normalize_embeddings=True)
    scores = q @ d.T  # (queries, documents): cosine
    ranks, near = [], []
    for i, qid in enumerate(qids):
        labelled = [index[x] for x in qrels[qid] if x in index]
        positive = labelled[0] if labels == "sparse" else rng.choice(labelled)
        known = {positive} if labels == "sparse" else set(labelled)
        order = [j for j in torch.argsort(scores[i], descending=True).tolist() if j == positive or j not in known]
        ranks.append(order.index(positive) + 1)
        bar = 0.95 * float(scores[i, positive])
        near.append(sum(1 for j in order[:30] if j != positive and float(scores[i, j]) >= bar))
    quartiles = statistics.quantiles(ranks, n=4)
    return (
        f"{root.name} {labels}: {len(qids)} queries, {statistics.mean(len(qrels[x]) for x in qids):.1f} labels a "
        f"query; positive's rank median {statistics.median(ranks)} (quartiles {quartiles[0]}, {quartiles[2]}), "
        f"{sum(r <= 3 for r in ranks) / len(ranks):.0%} in the top 3; top-30 documents within 5% of it: median "
        f"{statistics.median(near)}"
    )


if __name__ == "__main__":
    print(main(Path(sys.argv[1]), sys.argv[2]))
