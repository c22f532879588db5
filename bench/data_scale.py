"""Start-up time, memory and speed against the size of the training set (2 CPU processes, MiniLM).

    python -m bench.data_scale --record lab/benchmarks/results.jsonl    # then: python -m lab.results

For 10k, 100k and 1M synthetic triplets (query 12 words, documents 120 words; query length 32,
document length 180, as in the issue's measurement of the old path), and 100k distillation rows with
32 documents each:

1. the one-time conversion of the .jsonl into the Arrow cache (timed on its own, in this process), and
   ``hash_seconds``, the part of it spent on the sha256 of every row (``Rows.identity``: what mined parts
   and checkpoints are checked against), as the conversion itself measured it;
2. a 2-process `colbert-train` run on the warm cache: seconds from process start to the first
   optimizer step (rank 0), peak RSS per rank (trainer process; DataLoader workers apart), and
   steady-state samples/s (after the first 3 steps);
3. side by side at 10k: the same run with ``data.pretokenize: true`` (the old in-memory path:
   every row tokenised before step 1).

``--convert-only`` skips 2. and 3.: the conversion and its hash alone (the training columns are null).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # `python bench/X.py` as well as `python -m bench.X`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import git_commit, minilm, output_arguments, run_colbert_train, write_result

WORDS = [f"w{i}" for i in range(5000)]


def synth(path: Path, n: int, docs: int | None = None) -> Path:
    """``n`` deterministic rows: triplets, or distillation rows with ``docs`` documents and scores."""
    rng = random.Random(n)
    text = lambda k: " ".join(rng.choices(WORDS, k=k))  # noqa: E731
    with path.open("w") as f:
        for _ in range(n):
            if docs:
                row = {"query": text(12), "documents": [text(120) for _ in range(docs)], "scores": list(range(docs))}
            else:
                row = {"query": text(12), "positive": text(120), "negative": text(120)}
            f.write(json.dumps(row) + "\n")
    return path


def convert(path: Path, cache: Path, distillation: bool) -> tuple[float, float]:
    """Seconds to convert ``path`` into a cold Arrow cache, and those of it the row hash took."""
    from trainer.config.schema import DataSource
    from trainer.data import load_rows

    start = time.perf_counter()
    rows = load_rows(DataSource(path=str(path)), distillation, cache)
    seconds = round(time.perf_counter() - start, 1)
    return seconds, json.loads(rows.path.with_suffix(".json").read_text())["hash_seconds"]


def train(work: Path, data: Path, cache: Path, distillation: bool, pretokenize: bool, steps: int) -> dict:
    cfg = {
        "model": {"name_or_path": minilm(), "query_length": 32, "document_length": 180},
        "data": {"train": {"path": str(data)}, "cache_dir": str(cache), "pretokenize": pretokenize},
        "loss": {"name": "distillation"} if distillation else {"name": "contrastive"},
        "training": {"per_device_batch_size": 4 if distillation else 16, "max_steps": steps, "log_every": 5},
        "checkpoint": {"every_steps": 10_000},
        "evaluation": {"after_training": False},
    }
    m = run_colbert_train(work, 2, cfg)
    return {
        "first_step_seconds": m["first_step_seconds"],
        "peak_rss_mb": m["peak_rss_mb"],
        "worker_peak_rss_mb": m.get("worker_peak_rss_mb"),
        "steady_samples_per_second": m["steady_samples_per_second"],
        "wall_seconds": round(m["wall_seconds"], 1),
    }


_NO_RUN = dict.fromkeys(
    ("first_step_seconds", "peak_rss_mb", "worker_peak_rss_mb", "steady_samples_per_second", "wall_seconds")
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="10000,100000,1000000", help="triplet set sizes ('' for none)")
    p.add_argument("--distill-sizes", default="100000", help="32-document distillation set sizes")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--convert-only", action="store_true", help="time the conversion (and its hash) alone")
    output_arguments(p, "data-scale")
    args = p.parse_args()
    results: dict = {"commit": git_commit(), "runs": []}
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        tmp = Path(d)
        sizes = [int(n) for n in args.sizes.split(",") if n]
        plan = [(n, None, False) for n in sizes]
        if sizes and not args.convert_only:
            plan.insert(1, (sizes[0], None, True))  # the in-memory path at the smallest size, side by side
        plan += [(int(n), 32, False) for n in args.distill_sizes.split(",") if n]
        for n, docs, pretokenize in plan:
            data = tmp / f"rows-{n}-{docs or 2}.jsonl"
            if not data.exists():
                t0 = time.perf_counter()
                synth(data, n, docs)
                print(
                    f"generated {data.name} ({data.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t0:.0f}s"
                )
            cache = tmp / f"cache-{n}-{docs or 2}"
            conv, hashing = convert(data, cache, docs is not None) if not (cache / "arrow").exists() else (None, None)
            steps = max(6, args.steps // 2) if docs else args.steps
            work = tmp / f"run-{n}-{docs}-{pretokenize}"
            run = _NO_RUN if args.convert_only else train(work, data, cache, docs is not None, pretokenize, steps)
            row = {"rows": n, "documents_per_query": docs or 2, "pretokenize": pretokenize, "convert_seconds": conv}
            row |= {"hash_seconds": hashing, "file_mib": round(data.stat().st_size / 2**20), **run}
            results["runs"].append(row)
            print(json.dumps(row), flush=True)
    write_result(results, args)


if __name__ == "__main__":
    main()
