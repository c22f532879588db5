"""How much of exact MaxSim's top-k PLAID finds, with a trained model, on a real BEIR split.

    python bench/plaid_recall.py --model RUN/out/final-model --data PATH --split dev \\
        --record lab/benchmarks/results.jsonl

The job's index phase reports nDCG@10 through PLAID beside exact MaxSim; this measures the search itself:
for every query, the share of exact MaxSim's top 10 and top 100 (``trainer/retrieval/exact.py``) that PLAID
(``trainer/retrieval/plaid.py``, the index the job builds and serving uses) returns in its own top k, at each
``--nbits``. Both searches are the production code; the data path is an argument (the suite never needs it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import git_commit, output_arguments, write_result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a trained ColBERT (a job's final-model)")
    parser.add_argument("--data", type=Path, required=True, help="a BEIR directory")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--nbits", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--document-length", type=int, default=128)
    output_arguments(parser, "plaid-recall")
    args = parser.parse_args()

    import torch

    from trainer.config.schema import ModelConfig
    from trainer.evaluate import load_beir, retrieval_metrics
    from trainer.model import build_model
    from trainer.retrieval.exact import ModelRetriever
    from trainer.retrieval.plaid import build_index, search_index

    split = load_beir(args.data, args.split)
    cfg = ModelConfig(name_or_path=str(args.model), query_length=32, document_length=args.document_length)
    model = build_model(cfg, "cpu").eval()
    qrels = {q: split.qrels[q] for q in split.query_ids}
    started = time.perf_counter()
    exact, _ = ModelRetriever(model, split.corpus, 32, torch.device("cpu"), show=False, stored=False).search(
        split.queries, [set() for _ in split.queries], 100
    )
    exact_seconds = time.perf_counter() - started
    exact_run = {q: {split.corpus_ids[d]: s for d, s in top} for q, top in zip(split.query_ids, exact)}
    rows = [{"search": "exact MaxSim", "seconds": round(exact_seconds, 1), **retrieval_metrics(exact_run, qrels)}]
    with torch.no_grad():
        docs = model.encode(split.corpus, is_query=False, batch_size=32, show_progress_bar=False)
        queries = model.encode(split.queries, is_query=True, batch_size=32, show_progress_bar=False)
    for nbits in args.nbits:
        with tempfile.TemporaryDirectory() as folder:
            started = time.perf_counter()
            index = build_index(Path(folder), "bench", nbits, split.corpus_ids, docs, seed=0)
            hits = search_index(index, queries, 100)
            seconds = time.perf_counter() - started
        run = {q: dict(found) for q, found in zip(split.query_ids, hits)}
        overlap = {}
        for k in (10, 100):
            shares = [
                len({split.corpus_ids[d] for d, _ in top[:k]} & {d for d, _ in found[:k]}) / max(1, min(k, len(top)))
                for top, found in zip(exact, hits)
            ]
            overlap[f"recall@{k} of exact"] = sum(shares) / len(shares)
        rows.append(
            {"search": f"PLAID nbits {nbits}", "seconds": round(seconds, 1), **overlap, **retrieval_metrics(run, qrels)}
        )
    result = {"commit": git_commit(), "model": str(args.model), "split": args.split, "rows": rows}
    write_result(result, args)
    print("| search | recall@10 of exact | recall@100 of exact | nDCG@10 | Recall@100 | seconds |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['search']} | {r.get('recall@10 of exact', 1.0):.3f} | {r.get('recall@100 of exact', 1.0):.3f} "
            f"| {r['ndcg@10']:.4f} | {r['recall@100']:.3f} | {r['seconds']} |"
        )


if __name__ == "__main__":
    main()
