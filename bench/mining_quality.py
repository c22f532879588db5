"""Does mining make better retrievers? Held-out nDCG@10 of three recipes at equal optimizer steps, over seeds.

    python bench/mining_quality.py --seeds 1 2 3 --record lab/mining-quality/results.jsonl

Every arm trains all-MiniLM-L6-v2 as ColBERT from the same base weights for the same number of
optimizer steps on the quickstart's training queries, and is scored on the quickstart's held-out
split (modules training never sees) by exact MaxSim:

* ``bm25-1`` (the baseline): one BM25 negative per (query, positive), sampled from BM25 ranks 1-10;
* ``bm25-3``: three BM25 negatives (ranks 3-30, score ratio 0.95): more negatives, no model;
* ``mined-3``: two rounds; round 1 is ``bm25-3``, round 2 mines three negatives with round 1's
  model (exact MaxSim, ranks 3-30, ratio 0.95) and trains the base model again for the same steps;
* ``model-3``: one round; the base model itself (all-MiniLM-L6-v2 with a new projection) mines three
  negatives (exact MaxSim, ranks 3-30, ratio 0.95): mining without a first training run;
* ``model-7``: as ``model-3`` with seven negatives from ranks 3-50: twice the documents per step;
* ``model-3-wide``: as ``model-3``, mining among the first 4,000 documents of the training corpus
  (``mine.corpus``) instead of the training rows' own positives: a wider pool of the same packages;
* ``model-3-c30``: as ``model-3``, dropping the rows whose positive the base model ranks below 30
  (``mine.positive_within``, consistency filtering): fewer, cleaner rows for the same steps;
* ``*-k1000``: retrieve the top 1,000 instead of 100, so that a row whose positive ranks low still
  finds candidates below it (at top_k 100 the base model left a quarter of the packages rows none);
* ``trained-3``: the issue's own check. The ``bm25-1`` run of the same seed, once trained, mines three
  negatives (``mine.model``), and the base model trains again for the same steps. It costs
  the baseline's training run on top of its own, stated next to its figure.

``--data packages`` runs on ``trainer/packages_data.py``'s benchmark instead (docstrings of every
installed package, numpy and networkx held out), with ``--limit`` training pairs.

``mined-3`` costs one more training run and a mining pass; that is the price of its negatives, stated
next to its figure. The paired difference per seed (same seed, same data order) is reported with
the mean and spread. The arms are the study's, ``lab/mining-quality/arms.yaml``; ``--record`` merges the runs into
its record, from which ``python -m lab.results`` rebuilds docs/results.md and the plot.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from bench.common import ROOT, git_commit, minilm, quickstart_data, run_colbert_train
from lab.record import RecordError, put_mining_quality

ARMS_FILE = ROOT / "lab" / "mining-quality" / "arms.yaml"  # the study's arms; this file is its runner
ARMS: dict[str, dict] = yaml.safe_load(ARMS_FILE.read_text())


def benchmark(name: str) -> Path:
    """The training pairs (``train.jsonl``) of ``quickstart`` or ``packages``, built under data/ once; the
    held-out BEIR split is ``beir/`` beside them."""
    if name == "packages":
        from trainer.packages_data import build

        root = ROOT / "data" / "packages"
        if not (root / "train.jsonl").is_file():
            build(root, max_test_queries=300)
        return root / "train.jsonl"
    return quickstart_data(ROOT / "data" / "quickstart")


def mine_corpus(data: Path, size: int) -> Path:
    """A BEIR directory holding the first ``size`` documents of the training corpus (``mine.corpus``)."""
    out, source = data.parent / f"mine-corpus-{size}", data.parent / "corpus.jsonl"
    if not source.is_file():
        raise SystemExit(f"a wide arm mines from {source}, which this data set has not: use --data packages")
    if not (out / "corpus.jsonl").is_file():
        out.mkdir(parents=True, exist_ok=True)
        with open(source) as f:
            lines = [next(f) for _ in range(size)]
        (out / "corpus.jsonl").write_text("".join(lines))
    return out


def config(
    model: str,
    data: Path,
    beir: Path,
    arm: str,
    seed: int,
    steps: int,
    limit: int | None = None,
    doc_len: int = 128,
    runs: Path | None = None,
) -> dict:
    mine = {"top_k": 100, **ARMS[arm]}
    if size := mine.pop("corpus_size", None):
        mine["corpus"] = str(mine_corpus(data, size))
    if teacher_arm := mine.pop("mine_with", None):  # mine with that arm's trained model of the same seed
        trained = (runs or Path()) / f"{teacher_arm}-{seed}" / "out" / "final-model"
        if not trained.is_dir():
            raise SystemExit(f"arm {arm} mines with {trained}: run --arms {teacher_arm} first, with the same --workdir")
        mine["model"] = str(trained)
    return {
        "model": {"name_or_path": model, "query_length": 32, "document_length": doc_len},
        "data": {"train": {"path": str(data), "limit": limit}, "eval_beir": str(beir)},
        "training": {
            "per_device_batch_size": 32,
            "max_steps": steps,
            "learning_rate": 5e-5,
            "warmup_ratio": 0.1,
            "seed": seed,
            "log_every": 5,
        },
        "checkpoint": {"every_steps": 1000},
        "evaluation": {"after_training": True},
        "mine": mine,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=26, help="optimizer steps per training (the quickstart's epoch)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS))
    parser.add_argument("--baseline", default="bm25-1", help="the arm each other is paired with, seed by seed")
    parser.add_argument("--data", choices=["quickstart", "packages"], default="quickstart")
    parser.add_argument("--limit", type=int, help="use the first N training pairs")
    parser.add_argument("--document-length", type=int, default=128, help="document tokens (training and evaluation)")
    parser.add_argument("--workdir", type=Path, help="keep every run here; runs already finished are reused")
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS of each run (two benches side by side)")
    parser.add_argument("--summarize-only", action="store_true", help="with --workdir: tabulate finished runs only")
    parser.add_argument("--out", type=Path, help="write the result here as JSON")
    parser.add_argument(
        "--record", type=Path, help="merge it into the study's record: lab/mining-quality/results.jsonl"
    )
    parser.add_argument("--protocol", help="its protocol's name in the record (default DATA-STEPS)")
    args = parser.parse_args()
    if unknown := [a for a in args.arms if a not in ARMS]:
        raise SystemExit(f"--arms {' '.join(unknown)}: no such arm; name one of {', '.join(ARMS)} ({ARMS_FILE})")
    data = benchmark(args.data)
    beir = data.parent / "beir"
    runs: dict[str, dict[int, dict]] = {arm: {} for arm in args.arms}
    with tempfile.TemporaryDirectory(prefix="mining-quality-") as tmp:
        root = args.workdir or Path(tmp)  # --workdir keeps finished runs: a rerun skips them
        env = {"OMP_NUM_THREADS": str(args.threads)} if args.threads else None
        for seed in args.seeds:
            for arm in args.arms:
                wd = root / f"{arm}-{seed}"
                if (wd / "out" / "metrics.json").is_file() and (wd / "wall_seconds").is_file():
                    m, wall = (
                        json.loads((wd / "out" / "metrics.json").read_text()),
                        float((wd / "wall_seconds").read_text()),
                    )
                elif args.summarize_only:  # a run that did not finish is left out, and the table says n
                    continue
                else:
                    start = time.perf_counter()
                    m = run_colbert_train(
                        wd,
                        1,
                        config(minilm(), data, beir, arm, seed, args.steps, args.limit, args.document_length, root),
                        env,
                    )
                    wall = round(time.perf_counter() - start, 1)
                    (wd / "wall_seconds").write_text(str(wall))
                mined = sorted((wd / "out" / "mined").glob("round-*/mining.json"))  # the last round trained
                rows = json.loads(mined[-1].read_text())["rows"] if mined else None
                runs[arm][seed] = {
                    **{k: m["after"][k] for k in ("ndcg@10", "mrr@10")},
                    "steps": m["steps"],
                    "wall_seconds": wall,
                    "rows_trained_on": rows,
                }
                print(f"seed {seed} {arm:8s} nDCG@10 {m['after']['ndcg@10']:.4f} ({wall}s)", flush=True)
                for r in range(1, ARMS[arm].get("rounds", 1)):  # earlier rounds: the same steps, their own negatives
                    early = json.loads((wd / "out" / "rounds" / f"round-{r}" / "metrics.json").read_text())
                    runs.setdefault(f"{arm} round {r}", {})[seed] = {
                        **{k: early["after"][k] for k in ("ndcg@10", "mrr@10")},
                        "steps": early["steps"],
                        "wall_seconds": None,
                    }
    result = {
        "commit": git_commit(),
        "data": args.data,
        "limit": args.limit,
        "steps": args.steps,
        "document_length": args.document_length,
        "seeds": args.seeds,
        "runs": runs,
        "baseline": args.baseline,
        "summary": summarize(runs, args.baseline),
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.record:
        protocol = args.protocol or f"{args.data}-{args.steps}"
        try:
            put_mining_quality(args.record, result, protocol)
        except RecordError as e:
            raise SystemExit(f"--record: {e}") from None
        print(f"{args.record}: recorded as {protocol}; python -m lab.results rebuilds docs/results.md")
    print(table(result))


def summarize(runs: dict[str, dict[int, dict]], baseline: str) -> dict[str, dict]:
    """Mean and sample standard deviation per arm; the paired difference to the baseline per seed."""
    out, base = {}, runs.get(baseline, {})  # a run of other arms alone has no baseline to pair with
    for arm, by_seed in runs.items():
        values = [r["ndcg@10"] for r in by_seed.values()]
        diffs = [by_seed[s]["ndcg@10"] - base[s]["ndcg@10"] for s in by_seed if s in base]
        out[arm] = {
            "mean": statistics.mean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "paired_mean_gain": statistics.mean(diffs) if diffs else None,
            "paired_min_gain": min(diffs) if diffs else None,
            "wall_seconds_mean": statistics.mean(r["wall_seconds"] for r in by_seed.values())
            if all(r["wall_seconds"] for r in by_seed.values())
            else None,
        }
    return out


def table(result: dict) -> str:
    baseline = result.get("baseline", "bm25-1")
    lines = [
        f"| recipe | seeds | nDCG@10 mean ± std | gain over {baseline} (paired mean, worst seed) | per seed "
        "| rows kept | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, s in result["summary"].items():
        seeds = ", ".join(f"{r['ndcg@10']:.4f}" for r in result["runs"][arm].values())
        if arm == baseline:
            gain = "baseline"
        elif s["paired_mean_gain"] is None:  # no run of the baseline to pair with
            gain = "-"
        else:
            gain = f"{s['paired_mean_gain']:+.4f} (worst {s['paired_min_gain']:+.4f})"
        wall = f"{s['wall_seconds_mean']:.0f}" if s["wall_seconds_mean"] else "(inside the arm above)"
        n = len(result["runs"][arm])
        rows = {r.get("rows_trained_on") for r in result["runs"][arm].values()}
        kept = ", ".join(str(r) for r in sorted(rows)) if None not in rows else "-"
        lines.append(f"| {arm} | {n} | {s['mean']:.4f} ± {s['std']:.4f} | {gain} | {seeds} | {kept} | {wall} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
