"""How much of exact MaxSim's top-k PLAID finds, with a trained model, on a real BEIR split.

    python bench/plaid_recall.py --model RUN/out/final-model --data PATH --split dev \\
        --record lab/benchmarks/results.jsonl

The job's index phase reports nDCG@10 through PLAID beside exact MaxSim; this measures the search itself:
for every query, the share of exact MaxSim's top 10 and top 100 (``trainer/retrieval/exact.py``) that PLAID
(``trainer/retrieval/plaid.py``, the index the job builds and serving uses) returns in its own top k, at each
``--nbits``, and what a query costs: with the candidates the product asks fast-plaid for at each k (``full_scores``:
256 for a top 10, PyLate's 8,192 beyond) and with each ``--full-scores`` given. Both searches are the production
code; the data path is an argument (the suite never needs it).
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
    parser.add_argument("--full-scores", type=int, nargs="*", default=[8192], help="n_full_scores also measured")
    output_arguments(parser, "plaid-recall")
    args = parser.parse_args()

    import torch

    from trainer.config.schema import ModelConfig
    from trainer.evaluate import load_beir, retrieval_metrics
    from trainer.model import build_model
    from trainer.retrieval.exact import ModelRetriever
    from trainer.retrieval.plaid import build_index, full_scores

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
    rows = [
        {
            "search": "exact MaxSim",
            "ms a query, top 100": round(1000 * exact_seconds / len(split.queries), 2),
            **retrieval_metrics(exact_run, qrels),
        }
    ]
    with torch.no_grad():
        docs = model.encode(split.corpus, is_query=False, batch_size=32, show_progress_bar=False)
        queries = model.encode(split.queries, is_query=True, batch_size=32, show_progress_bar=False)
    for nbits in args.nbits:
        with tempfile.TemporaryDirectory() as folder:
            started = time.perf_counter()
            index = build_index(Path(folder), "bench", nbits, split.corpus_ids, docs, seed=0)
            build_seconds = time.perf_counter() - started
            for setting in [None, *args.full_scores]:
                row = {"search": f"PLAID nbits {nbits}", "build seconds": round(build_seconds, 1)}
                row["n_full_scores"] = f"{full_scores(10)} / {full_scores(100)}" if setting is None else str(setting)
                for k in (10, 100):
                    started = time.perf_counter()
                    hits = index.search(queries, k, n_full_scores=setting)
                    row[f"ms a query, top {k}"] = round(1000 * (time.perf_counter() - started) / len(queries), 2)
                    wanted = [{split.corpus_ids[d] for d, _ in top[:k]} for top in exact]
                    shares = [len(w & {d for d, _ in found}) / max(1, len(w)) for w, found in zip(wanted, hits)]
                    row[f"recall@{k} of exact"] = sum(shares) / len(shares)
                    figures = retrieval_metrics({q: dict(found) for q, found in zip(split.query_ids, hits)}, qrels)
                    row.update({"ndcg@10": figures["ndcg@10"]} if k == 10 else {"recall@100": figures["recall@100"]})
                rows.append(row)
    result = {"commit": git_commit(), "model": str(args.model), "split": args.split, "rows": rows}
    write_result(result, args)
    from lab.results import plaid_recall_rows

    print(plaid_recall_rows(result))


if __name__ == "__main__":
    main()
