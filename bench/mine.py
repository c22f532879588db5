"""How long and how much memory mining takes: BM25 at 10k queries x 100k documents, exact MaxSim and PLAID
measured on a sample and scaled, all through the production retrievers of ``trainer/retrieval/``, one process.

    python bench/mine.py --record lab/benchmarks/results.jsonl

Documents: the package-docstring benchmark's real documents (``trainer/packages_data.py``), topped up
to ``--documents`` with documents made of their shuffled sentences (the same length and vocabulary).
Queries: their summary lines. Each retriever runs in a child process of its own, so its peak RSS is
its own. Reported per query and per document, and extrapolated (a formula, stated) to 1M x 10M on GPUs.

    python bench/mine.py --crossover 1024 4096 16384 --model-queries 256 --record lab/benchmarks/results.jsonl

measures instead where PLAID's search gets cheaper than exact MaxSim: both at each corpus size, side by
side, one core each (recorded as ``mine-crossover``; ``python -m lab.results`` draws its plot).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ENV, ROOT, git_commit, minilm, output_arguments, write_result

H100_BF16_DENSE = 989e12  # FLOP/s, the peak bench/gpu.py's MFU is taken against


def texts(n_docs: int, n_queries: int, seed: int = 0) -> tuple[list[str], list[str]]:
    from trainer.packages_data import build

    root = ROOT / "data" / "packages"
    if not (root / "corpus.jsonl").is_file():
        build(root, max_test_queries=300)
    docs = [json.loads(line)["text"] for line in (root / "corpus.jsonl").open()]
    queries = [json.loads(line)["query"] for line in (root / "train.jsonl").open()]
    rng = random.Random(seed)
    sentences = [s.strip() for d in docs for s in d.split(". ") if len(s.strip()) > 20]
    while len(docs) < n_docs:
        docs.append(". ".join(rng.sample(sentences, rng.randint(2, 6))))
    while len(queries) < n_queries:
        queries.append(rng.choice(sentences)[:120])
    return docs[:n_docs], queries[:n_queries]


def child(kind: str, n_docs: int, n_queries: int, top_k: int) -> dict:
    """Run in a fresh process: build the retriever, search every query, report seconds and peak RSS.

    ``model`` and ``plaid`` both encode the documents while they build; PLAID's index time is that
    encoding plus its k-means and compression, and its search also encodes the queries' positives, whose
    exact scores the mining filter divides by."""
    import tempfile

    import torch

    from trainer.retrieval.bm25 import Bm25Retriever
    from trainer.retrieval.exact import ModelRetriever
    from trainer.retrieval.plaid import PlaidRetriever

    torch.set_num_threads(max(1, torch.get_num_threads()))
    docs, queries = texts(n_docs, n_queries)
    positives = [{i % n_docs} for i in range(n_queries)]
    start = time.perf_counter()
    if kind == "bm25":
        retriever = Bm25Retriever(docs, show=False)
    else:
        from trainer.config.mine import MineConfig
        from trainer.config.schema import ModelConfig
        from trainer.model import build_model

        model = build_model(ModelConfig(name_or_path=minilm(), query_length=32, document_length=128), "cpu")
        if kind == "model":
            retriever = ModelRetriever(model, docs, 64, torch.device("cpu"), show=False)
        else:
            folder = Path(tempfile.mkdtemp(prefix="bench-plaid-"))
            nbits = MineConfig.model_fields["nbits"].default  # what a user gets; extrapolate() sizes the same
            retriever = PlaidRetriever(model, docs, 64, torch.device("cpu"), False, nbits=nbits, folder=folder)
    built = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(0, n_queries, 1024):
        retriever.search(queries[i : i + 1024], positives[i : i + 1024], top_k)
    searched = time.perf_counter() - start
    if kind == "plaid":
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    peak = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # KiB on Linux
    out = {
        "kind": kind,
        "documents": n_docs,
        "queries": n_queries,
        "index_seconds": round(built, 2),
        "search_seconds": round(searched, 2),
        "peak_rss_mb": peak,
    }
    if kind == "model":
        tokens = sum(int(m.sum()) for _, _, m in retriever.chunks)
        out["document_tokens_mean"] = round(tokens / n_docs, 1)
    return out


def run_child(kind: str, n_docs: int, n_queries: int, top_k: int, threads: int | None = None) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        kind,
        "--documents",
        str(n_docs),
        "--queries",
        str(n_queries),
        "--top-k",
        str(top_k),
    ]
    env = {**ENV, "OMP_NUM_THREADS": str(threads)} if threads else ENV
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-3000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def extrapolate(model: dict, dim: int = 128, q_tokens: int = 32) -> dict:
    """Exact MaxSim cost as a formula of the sample: scoring is queries x documents x q_tokens x d_tokens
    x dim x 2 FLOPs; encoding is per text. Scaled linearly from the measured sample on this CPU, and by
    FLOPs to GPUs (40% of an H100's bf16 peak for the scoring matmuls, which is optimistic for MaxSim)."""
    from trainer.config.mine import MineConfig

    nbits = MineConfig.model_fields["nbits"].default
    d_tokens = model["document_tokens_mean"]
    pairs = model["documents"] * model["queries"]
    encode_per_doc = model["index_seconds"] / model["documents"]
    score_per_pair = model["search_seconds"] / pairs  # includes the queries' encoding, which is small
    flops_per_pair = q_tokens * d_tokens * dim * 2
    cpu_10k_100k = 100_000 * encode_per_doc + 1e4 * 1e5 * score_per_pair
    gpu_flops = 1e6 * 1e7 * flops_per_pair
    return {
        "encode_seconds_per_document_cpu": encode_per_doc,
        "score_seconds_per_query_document_pair_cpu": score_per_pair,
        "flops_per_query_document_pair": flops_per_pair,
        "cpu_hours_10k_x_100k": cpu_10k_100k / 3600,
        "h100_hours_1m_x_10m_scoring_at_40pct": gpu_flops / (0.4 * H100_BF16_DENSE) / 3600,
        "embeddings_gb_10m_documents_fp16": 1e7 * d_tokens * dim * 2 / 1e9,
        # PLAID keeps per token a centroid id (4 bytes) and dim x nbits bits of residual (mine.nbits)
        "plaid_nbits": nbits,
        "plaid_index_gb_10m_documents": 1e7 * d_tokens * (4 + dim * nbits / 8) / 1e9,
    }


def crossover(sizes: list[int], n_queries: int, top_k: int) -> dict:
    """Exact MaxSim against PLAID at growing corpora, the two side by side (one core each, at once): where
    does PLAID's fixed cost per query pay for itself?"""
    from concurrent.futures import ThreadPoolExecutor

    rows = []
    with ThreadPoolExecutor(2) as pool:
        for n in sizes:
            measure = lambda kind, n=n: run_child(kind, n, n_queries, top_k, threads=1)  # noqa: E731
            exact, plaid = pool.map(measure, ["model", "plaid"])
            rows.append({"documents": n, "exact": exact, "plaid": plaid})
            print(
                f"{n:,} documents: exact {1000 * exact['search_seconds'] / n_queries:.0f} ms/query, "
                f"PLAID {1000 * plaid['search_seconds'] / n_queries:.0f} ms/query",
                flush=True,
            )
    result = {"commit": git_commit(), "queries": n_queries, "top_k": top_k, "rows": rows}
    print(
        "| documents | exact: index s | exact: search ms/query | PLAID: index s | PLAID: search ms/query "
        "| exact peak RSS | PLAID peak RSS |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        e, p = r["exact"], r["plaid"]
        print(
            f"| {r['documents']:,} | {e['index_seconds']:.0f} | {1000 * e['search_seconds'] / n_queries:.0f} | "
            f"{p['index_seconds']:.0f} | {1000 * p['search_seconds'] / n_queries:.0f} | "
            f"{e['peak_rss_mb']:,} MiB | {p['peak_rss_mb']:,} MiB |"
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=["bm25", "model", "plaid"])
    parser.add_argument("--documents", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--model-documents", type=int, default=4096, help="exact MaxSim sample: documents")
    parser.add_argument("--model-queries", type=int, default=1024, help="exact MaxSim sample: queries")
    parser.add_argument("--top-k", type=int, default=100)
    parser.add_argument(
        "--crossover",
        type=int,
        nargs="+",
        metavar="DOCUMENTS",
        help="instead: exact MaxSim against PLAID at these corpus sizes",
    )
    output_arguments(parser, "mine")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.documents, args.queries, args.top_k)))
        return
    if args.crossover and args.name == "mine":  # the other measurement, its own line in the record
        args.name = "mine-crossover"
    if args.crossover:
        write_result(crossover(args.crossover, args.model_queries, args.top_k), args)
        return
    bm25 = run_child("bm25", args.documents, args.queries, args.top_k)
    model = run_child("model", args.model_documents, args.model_queries, args.top_k)
    plaid = run_child("plaid", args.model_documents, args.model_queries, args.top_k)
    result = {
        "commit": git_commit(),
        "bm25": bm25,
        "model_sample": model,
        "plaid_sample": plaid,
        "model_scaled": extrapolate(model),
    }
    write_result(result, args)
    x = result["model_scaled"]
    print("| retriever | queries x documents | index | search | per query | per document (index) | peak RSS |")
    print("|---|---|---|---|---|---|---|")
    for r in (bm25, model, plaid):
        print(
            f"| {r['kind']} | {r['queries']:,} x {r['documents']:,} | {r['index_seconds']:.1f} s | "
            f"{r['search_seconds']:.1f} s | {1000 * r['search_seconds'] / r['queries']:.2f} ms | "
            f"{1e6 * r['index_seconds'] / r['documents']:.0f} µs | {r['peak_rss_mb']:,} MiB |"
        )
    print(
        f"exact MaxSim scaled: 10k x 100k on this CPU ~{x['cpu_hours_10k_x_100k']:.1f} h; "
        f"1M x 10M on H100s ~{x['h100_hours_1m_x_10m_scoring_at_40pct']:.1f} GPU-hours of scoring, "
        f"{x['embeddings_gb_10m_documents_fp16']:.0f} GB of fp16 document embeddings, "
        f"{x['plaid_index_gb_10m_documents']:.0f} GB as a PLAID index (nbits {x['plaid_nbits']})"
    )


if __name__ == "__main__":
    main()
