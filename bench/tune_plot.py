"""A sweep's metric against its trials, from ``colbert-k8s tune status NAME -o json`` (any engine).

    colbert-k8s tune status nf --workdir /tmp/nf-tune -o json > nf.json
    python bench/tune_plot.py nf.json docs/tune_nfcorpus.png

Each succeeded trial is a point (in the order the sweep ran them), the best so far a line, the best trial
named; failed and early-stopped trials are marked on the axis; a trial not run yet is an empty place.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def plot(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trials = record["trials"]
    xs = [i + 1 for i, t in enumerate(trials) if t.get("metric") is not None]
    ys = [t["metric"] for t in trials if t.get("metric") is not None]
    better = max if record["goal"] == "max" else min
    running = [better(ys[: i + 1]) for i in range(len(ys))]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(xs, ys, "o", label="trial")
    ax.step(xs, running, where="post", label="best so far")
    unscored = (("Failed", "x", "red", "failed"), ("EarlyStopped", "v", "grey", "stopped early"))
    for state, marker, color, label in unscored:
        at = [i + 1 for i, t in enumerate(trials) if t["state"] == state]
        if at:  # no final figure: marked on the axis
            ax.plot(at, [min(ys or [0])] * len(at), marker, color=color, label=label)
    if record.get("best"):
        best = record["best"]
        ax.annotate(
            best["name"],
            (trials.index(next(t for t in trials if t["name"] == best["name"])) + 1, best["metric"]),
            textcoords="offset points",
            xytext=(4, 4),
        )
    ax.set_xlim(0.5, len(trials) + 0.5)  # every planned trial has its place, run or not
    ax.set_xticks(range(1, len(trials) + 1))
    ax.set_xlabel("trial")
    ax.set_ylabel(f"{record['metric']} ({record['engine']} sweep {record['name']})")
    ax.legend(loc="best")  # matplotlib picks the corner with the fewest points under it
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("status", type=Path, help="the JSON of `colbert-k8s tune status NAME -o json`")
    parser.add_argument("png", type=Path)
    args = parser.parse_args()
    plot(json.loads(args.status.read_text()), args.png)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
