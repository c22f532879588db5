"""Join lightonai/ms-marco-en-bge-gemma's ids into the text rows colbert-train reads, once, where the hub is.

    python recipes/prepare_msmarco.py ms-marco-en-bge-gemma.parquet [--limit N]

The dataset ships three subsets, as PyLate's distillation example loads them: ``train`` (query_id,
document_ids, scores), ``queries`` (query_id, text) and ``documents`` (document_id, text). PyLate
joins them on the fly in every training process; a job of many pods is better served by one file of
(query, documents, scores) rows, staged into each pod's cache. Not run by this project's tests (it
needs the hub); the columns it writes are the ones recipes/msmarco-distillation.yaml maps.
"""

from __future__ import annotations

import argparse

import pyarrow as pa
import pyarrow.parquet as pq
from datasets import load_dataset

NAME = "lightonai/ms-marco-en-bge-gemma"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--limit", type=int, help="only the first N training rows (a dry run)")
    args = parser.parse_args()
    train = load_dataset(NAME, "train", split="train")
    if args.limit:
        train = train.select(range(args.limit))
    queries = {r["query_id"]: r["text"] for r in load_dataset(NAME, "queries", split="train")}
    documents = {r["document_id"]: r["text"] for r in load_dataset(NAME, "documents", split="train")}
    writer = None
    for start in range(0, len(train), 10_000):
        batch = train[start : start + 10_000]
        table = pa.table(
            {
                "query": [queries[q] for q in batch["query_id"]],
                "documents": [[documents[d] for d in ids] for ids in batch["document_ids"]],
                "scores": [[float(s) for s in scores] for scores in batch["scores"]],
            }
        )
        writer = writer or pq.ParquetWriter(args.out, table.schema)
        writer.write_table(table)
    if writer:
        writer.close()
    print(f"wrote {args.out}: {len(train)} rows")


if __name__ == "__main__":
    main()
