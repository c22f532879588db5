"""Peak RSS per process against the global batch, for `contrastive` and `cached-contrastive` (2 processes).

    python bench/memory.py --repeats 3 --record lab/benchmarks/results.jsonl && python -m lab.results

GradCache keeps only embeddings for the whole batch and runs the encoder on fixed mini-batches, so
its memory should stay flat while plain contrastive grows with the batch.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # `python bench/X.py` as well as `python -m bench.X`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import git_commit, minilm, output_arguments, quickstart_data, run_colbert_train, stats, write_result

GLOBAL_BATCHES = (64, 256, 1024)


def _available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


def _projection(measured: dict, global_batch: int) -> float | None:
    """Linear extrapolation of peak RSS from the two largest batches measured so far."""
    points = sorted((int(b), s["median"]) for b, s in measured.items() if "median" in s)
    if len(points) < 2:
        return None
    (b1, m1), (b2, m2) = points[-2:]
    return m2 + (m2 - m1) / (b2 - b1) * (global_batch - b2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--mini-batch", type=int, default=16)
    p.add_argument("--query-length", type=int, default=16)
    p.add_argument("--document-length", type=int, default=32)
    output_arguments(p, "memory")
    args = p.parse_args()
    model = minilm()
    work = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    rows = quickstart_data(work / "data").read_text().splitlines()
    data = work / "data" / "repeated.jsonl"  # enough rows for one global batch of 1024 (content is irrelevant here)
    data.write_text("\n".join(rows * (1 + max(GLOBAL_BATCHES) // len(rows))) + "\n")
    results = {
        "commit": git_commit(),
        "processes": 2,
        "mini_batch": args.mini_batch,
        "query_length": args.query_length,
        "document_length": args.document_length,
        "peak_rss_mb": {},
    }
    for loss in ("contrastive", "cached-contrastive"):
        results["peak_rss_mb"][loss] = {}
        for global_batch in GLOBAL_BATCHES:
            loss_cfg = {"name": loss} if loss == "contrastive" else {"name": loss, "mini_batch_size": args.mini_batch}
            projected = _projection(results["peak_rss_mb"][loss], global_batch)
            if projected and 2 * projected > 0.85 * _available_mb():
                # two processes would not fit in this machine's memory: say so instead of OOM-killing it
                results["peak_rss_mb"][loss][str(global_batch)] = {"skipped": True, "projected": projected}
                print(
                    f"{loss} global={global_batch}: not run, projected {projected:.0f} MiB/process x 2 "
                    f"exceeds the {_available_mb():.0f} MiB available",
                    flush=True,
                )
                continue
            peaks = []
            for rep in range(args.repeats):
                cfg = {
                    "model": {
                        "name_or_path": model,
                        "query_length": args.query_length,
                        "document_length": args.document_length,
                    },
                    "data": {"train": {"path": str(data)}},
                    "loss": loss_cfg,
                    "training": {"per_device_batch_size": global_batch // 2, "max_steps": 1},
                    "evaluation": {"after_training": False},
                }
                m = run_colbert_train(work / f"{loss}-{global_batch}-{rep}", 2, cfg)
                peaks.append(max(m["peak_rss_mb"]))
                print(
                    f"{loss} global={global_batch} rep={rep}: peak RSS {max(m['peak_rss_mb']):.0f} MiB/process",
                    flush=True,
                )
            results["peak_rss_mb"][loss][str(global_batch)] = stats(peaks)
    write_result(results, args)


if __name__ == "__main__":
    main()
