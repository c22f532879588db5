"""The learning curve across budgets: nDCG@10 against optimizer steps, one line per arm, from the results files
``bench/nfcorpus.py`` wrote at different ``--steps`` (issue 39 asks for one: a lever can flip with training length).

    python bench/nfcorpus_budget.py bench/results/nfcorpus_sparse_test_{48,48_drop,240,240_drop}.json \
        --seeds 1 2 --out docs/nfcorpus_sparse_test_budget.png

Only the seeds given are averaged, so every point of a line is the mean of the same seeds; ``dense`` (the base
model untrained) is the same at every budget and is drawn as a level line. Reads results, trains nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def curves(files: list[Path], seeds: list[int]) -> dict[str, dict[int, float]]:
    """``{arm: {steps: mean nDCG@10 over seeds}}``, an arm's point only where every one of ``seeds`` ran.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> run = {"a": {"1": {"ndcg@10": 0.25}, "2": {"ndcg@10": 0.75}}, "b": {"1": {"ndcg@10": 0.1}}}
    >>> _ = (d / "r.json").write_text(json.dumps({"steps": 48, "runs": run}))
    >>> curves([d / "r.json"], [1, 2])
    {'a': {48: 0.5}}
    """
    out: dict[str, dict[int, float]] = {}
    for file in files:
        result = json.loads(file.read_text())
        for arm, runs in result["runs"].items():
            if not all(str(s) in runs for s in seeds):
                continue
            mean = statistics.mean(runs[str(s)]["ndcg@10"] for s in seeds)
            points = out.setdefault(arm, {})
            if points.get(result["steps"], mean) != mean:  # two files, two runs of one arm: which one is drawn?
                raise SystemExit(f"{file}: {arm} at {result['steps']} steps differs from an earlier file's; pass one")
            points[result["steps"]] = mean
    return out


def plot(lines: dict[str, dict[int, float]], seeds: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    steps = sorted({s for points in lines.values() for s in points})
    for arm, points in sorted(lines.items()):
        if arm == "dense":
            ax.axhline(statistics.mean(points.values()), color="grey", ls="--", label="dense (base model, untrained)")
            continue
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], marker="o", label=arm)
    ax.set_xticks(steps)
    ax.set_xlabel("optimizer steps (batch 16)")
    ax.set_ylabel(f"nDCG@10 (mean of seeds {', '.join(map(str, seeds))})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="results files of bench/nfcorpus.py")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args()
    lines = curves(args.results, args.seeds)
    for arm, points in sorted(lines.items()):
        print(f"{arm:14s} " + "  ".join(f"{s} steps {v:.4f}" for s, v in sorted(points.items())))
    plot(lines, args.seeds, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
