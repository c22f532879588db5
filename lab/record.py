"""The research record's file format: one ``results.jsonl`` per study, and the statistics its tables are made of.

A study's file holds one JSON object a line, sorted, so that a rerun's diff shows only what changed (git
keeps the versions). Every file opens with a header line (``{"kind": ...}``: how the lines below read).
Kinds:

``nfcorpus``: a run of ``bench/nfcorpus.py`` a line, keyed by (labels, split, steps, arm, seed), with its
    nDCG@10, Recall@100, wall seconds, rows trained on, and its per-query nDCG@10 as a list in the order of
    the split's query line (``{"split": ..., "queries": [...]}``): 4 digits a query, the whole run in a few KB.
``mining-quality``: a protocol line (``{"protocol": ..., "data": ..., "steps": ...}``) and its runs, keyed
    by (protocol, arm, seed).
``benchmarks``, ``teachers``, ``quickstart``: one result a line, keyed by its ``name``.
``tune``: a sweep a line, keyed by its ``name``: ``colbert-k8s tune status NAME -o json``'s record (each trial's
    values, state, dev ``metric`` and seconds), with each trial's ``commit`` and, for a trial scored on test, its
    ``test`` figures.

``put`` merges a script's own JSON output into a study's file: a run with the same key is replaced (its
earlier version stays in git), an identical one keeps the commit it was first recorded at. Stdlib only.
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import statistics
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "lab"
RESULTS = "results.jsonl"
NFCORPUS_KEY = ("labels", "split", "steps", "arm", "seed")
# the NFCorpus recipe study's headline: the arm the shipped recipe trains as on NFCorpus, and what it is held against,
# as the pages name them. The recipe's loss.temperature (trainer/labels.py) and model.query_length
# (trainer/query_length.py) are auto; on each study's data they resolve to fixed values, so the recipe trains as one
# fixed arm there (SHIPPED_AS: the arm, the labels' structure, the query length; a test checks that
# bench/nfcorpus.py's SHIPPED_ARM with those values is this arm)
SHIPPED_ARM = "recipe-t-auto-q16"
SHIPPED_AS = {
    "nfcorpus-recipe": (SHIPPED_ARM, "incomplete", 16),
    "two-regimes": ("recipe-t1", "complete", 32),
}
PREVIOUS_ARM = "recipe-pca-t0.25"
ARM_NAMES = {
    SHIPPED_ARM: "the shipped recipe",
    "reference": "PyLate's example script",
    "bm25-1": "one BM25 negative",
    "dense": "the base model as a bi-encoder",
    PREVIOUS_ARM: "the recipe before (queries of 32 tokens)",
}
LABELS = {"sparse": "one positive per query", "full": "every label (NFCorpus as given)"}
# docs/tune.md's worked sweep: its study and its line's name
TUNE_SWEEP = ("tune-nfcorpus", "nf")
# the NFCorpus runs' fixed settings: a results file of other settings is refused (it needs a study of its own)
NFCORPUS_SETTINGS = ("batch", "lr", "document_length", "rows_per_query")


class RecordError(ValueError):
    """Input the record cannot take; the message names it and the fix (one line)."""


def read(path: Path) -> list[dict]:
    """A study's lines as dicts (the header first)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def dumps(record: dict) -> str:
    """One line, no spaces: the per-query lists are most of the bytes.

    >>> dumps({"arm": "bm25-1", "per_query": [0.5, 0]})
    '{"arm":"bm25-1","per_query":[0.5,0]}'
    """
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False)


def write(path: Path, records: list[dict]) -> None:
    """Written whole or not at all (a temporary file renamed over the old one)."""
    text = "".join(dumps(r) + "\n" for r in records)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def git_commit() -> str:
    res = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return res.stdout.strip() or "unknown"


def _num(value: float, digits: int = 4) -> float | int:
    """A per-query figure as the record keeps it: 4 digits, 0 and 1 without a decimal point.

    >>> _num(0.123456), _num(0.0), _num(1.0)
    (0.1235, 0, 1)
    """
    value = round(value, digits)
    return int(value) if value == int(value) else value


# --- NFCorpus runs ---------------------------------------------------------------------------------------


def nfcorpus_runs(path: Path) -> dict[tuple[str, str, int], dict[str, dict[int, dict]]]:
    """``{(labels, split, steps): {arm: {seed: run}}}``, each run with its ``per_query`` as a dict again."""
    lines = read(path)
    queries = {r["split"]: r["queries"] for r in lines if "queries" in r}
    cells: dict[tuple[str, str, int], dict[str, dict[int, dict]]] = {}
    for r in lines:
        if "arm" not in r:
            continue
        run = {k: v for k, v in r.items() if k not in NFCORPUS_KEY}
        if "per_query" in run:
            run["per_query"] = dict(zip(queries[r["split"]], run["per_query"]))
        cell = cells.setdefault((r["labels"], r["split"], r["steps"]), {})
        cell.setdefault(r["arm"], {})[r["seed"]] = run
    return {k: {arm: dict(sorted(s.items())) for arm, s in v.items()} for k, v in sorted(cells.items())}


def _same_run(a: dict, b: dict) -> bool:
    """Two records of one key are one run when their figures agree (to the 4 digits the record keeps)."""
    if round(a["ndcg@10"], 4) != round(b["ndcg@10"], 4):
        return False
    return a.get("per_query") is None or b.get("per_query") is None or a["per_query"] == b["per_query"]


def put_nfcorpus(path: Path, result: dict, note: str | None = None) -> int:
    """Merge ``bench/nfcorpus.py``'s output into the study file at ``path``; returns the runs it changed."""
    lines = read(path) if path.is_file() else [{"kind": "nfcorpus", **{k: result[k] for k in NFCORPUS_SETTINGS}}]
    header = lines[0]
    if header.get("kind") != "nfcorpus":
        raise RecordError(f"{path} holds {header.get('kind')} results, not bench/nfcorpus.py's: give another study")
    if other := {k: result.get(k) for k in NFCORPUS_SETTINGS if result.get(k) != header[k]}:
        raise RecordError(f"{path}: this study ran at {header}, the results at {other}: record them in a new study")
    queries = {r["split"]: r["queries"] for r in lines if "queries" in r}
    runs = {tuple(r[k] for k in NFCORPUS_KEY): r for r in lines if "arm" in r}
    changed = 0
    labels, split, steps = result.get("labels", "full"), result["split"], result["steps"]
    for arm, by_seed in result["runs"].items():
        for seed, run in by_seed.items():
            record = {"labels": labels, "split": split, "steps": steps, "arm": arm, "seed": int(seed)}
            record["commit"] = run.get("commit", result["commit"])
            for k in ("ndcg@10", "recall@100", "wall_seconds", "rows", "note"):  # what a run measured
                if run.get(k) is not None:
                    record[k] = run[k]
            if note and "note" not in record:
                record["note"] = note
            if per_query := run.get("per_query"):
                order = queries.setdefault(split, sorted(per_query))
                if set(per_query) != set(order):
                    raise RecordError(f"{arm} seed {seed}: its {split} queries are not the study's; another data set?")
                record["per_query"] = [_num(per_query[q]) for q in order]
            key = tuple(record[k] for k in NFCORPUS_KEY)
            old = runs.get(key)
            if old and _same_run(old, record):  # recorded before: keep its commit, fill in what it lacked
                merged = {**record, **old}
                wall = record.get("wall_seconds")
                if wall is not None and old.get("wall_seconds") not in (None, wall):  # run again, timed again
                    merged["earlier_wall_seconds"] = [*old.get("earlier_wall_seconds", []), old["wall_seconds"]]
                    merged["wall_seconds"] = wall
                changed += merged != old
                runs[key] = merged
            else:
                runs[key], changed = record, changed + 1
    out = [header] + [{"split": s, "queries": q} for s, q in sorted(queries.items())]
    write(path, out + [runs[k] for k in sorted(runs)])
    return changed


@functools.lru_cache(maxsize=8)
def _draws(n: int, count: int) -> tuple[tuple[int, ...], ...]:
    """The bootstrap's resamples of ``n`` queries: the same for every pair of arms (one seeded stream)."""
    rng = random.Random(0)
    return tuple(tuple(rng.randrange(n) for _ in range(n)) for _ in range(count))


def paired(runs: dict[int, dict], base: dict[int, dict], draws: int = 2000) -> dict:
    """Mean paired gain over seeds, the worst seed, and a 95% bootstrap interval: each draw resamples the
    queries once and takes the same ones in every seed (a hard query is hard in every seed, so seeds are not
    independent samples of queries). A run without per-query figures pairs by its mean alone.

    >>> a = {1: {"ndcg@10": 0.5, "per_query": {"q": 0.5, "r": 0.5}}}
    >>> b = {1: {"ndcg@10": 0.4, "per_query": {"q": 0.4, "r": 0.4}}}
    >>> {k: round(v, 4) for k, v in paired(a, b).items()}
    {'gain': 0.1, 'worst': 0.1, 'low': 0.1, 'high': 0.1}
    """
    seeds = [s for s in runs if s in base]
    gains = [runs[s]["ndcg@10"] - base[s]["ndcg@10"] for s in seeds]
    with_queries = [s for s in seeds if runs[s].get("per_query") and base[s].get("per_query")]
    queries = sorted(base[with_queries[0]]["per_query"]) if with_queries else []
    diffs = [[runs[s]["per_query"][q] - base[s]["per_query"][q] for q in queries] for s in with_queries]
    low = high = None
    if diffs:
        n = len(queries)
        # the mean over seeds of each draw's mean is the draw's mean of the per-query mean over seeds
        per_query = [math.fsum(d[i] for d in diffs) / len(diffs) for i in range(n)]
        means = sorted(math.fsum(per_query[i] for i in pick) / n for pick in _draws(n, draws // 10))
        low, high = means[int(0.025 * len(means))], means[int(0.975 * len(means)) - 1]
    return {"gain": statistics.mean(gains), "worst": min(gains), "low": low, "high": high}


def summarize(runs: dict[str, dict[int, dict]], against: tuple[str, ...]) -> dict:
    """Per arm: seeds, mean, std, Recall@100, wall seconds, rows, and the paired gain over each of ``against``."""
    out = {}
    for arm, by_seed in runs.items():
        values = [r["ndcg@10"] for r in by_seed.values()]
        walls = [r["wall_seconds"] for r in by_seed.values() if r.get("wall_seconds") is not None]
        recalls = [r["recall@100"] for r in by_seed.values() if r.get("recall@100") is not None]
        out[arm] = {
            "seeds": len(values),
            "mean": statistics.mean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "recall@100": statistics.mean(recalls) if recalls else None,
            "wall_seconds": statistics.mean(walls) if walls else None,
            "rows": sorted({r["rows"] for r in by_seed.values() if r.get("rows") is not None}),
            "paired": {b: paired(by_seed, runs[b]) for b in against if b in runs and b != arm},
        }
    return out


def gain(v: dict | None) -> str:
    """``+0.0116 (+0.0020) [-0.0011, +0.0248]``: mean, worst seed, 95% interval; ``-`` for an arm against itself.

    >>> gain({"gain": 0.0116, "worst": 0.002, "low": -0.0011, "high": 0.0248})
    '+0.0116 (+0.0020) [-0.0011, +0.0248]'
    """
    if v is None:
        return "-"
    interval = f" [{v['low']:+.4f}, {v['high']:+.4f}]" if v["low"] is not None else ""
    return f"{v['gain']:+.4f} ({v['worst']:+.4f}){interval}"


def table(summary: dict, against: tuple[str, ...]) -> str:
    """One row per arm: its mean, and its paired gain over each of ``against`` that ran (worst seed, and the
    95% interval where the runs have per-query figures)."""
    against = tuple(b for b in against if b in summary)
    interval = any(p["low"] is not None for s in summary.values() for p in s["paired"].values())
    lines = [
        "| arm | seeds | nDCG@10 mean ± std | "
        + "".join(f"over {b} (worst seed){' [95% interval]' if interval else ''} | " for b in against)
        + "Recall@100 | rows trained from | wall s (mine + train) |",
        "|---|---|---|" + "---|" * len(against) + "---|---|---|",
    ]
    for arm, s in summary.items():
        gains = "".join(f"{gain(s['paired'].get(b))} | " for b in against)
        wall = "-" if s["wall_seconds"] is None else f"{s['wall_seconds']:.0f}"
        recall = "-" if s["recall@100"] is None else f"{s['recall@100']:.3f}"
        lines.append(
            f"| {arm} | {s['seeds']} | {s['mean']:.4f} ± {s['std']:.4f} | {gains}{recall} "
            f"| {', '.join(map(str, s['rows'])) or '-'} | {wall} |"
        )
    return "\n".join(lines)


# --- the other kinds: one line per protocol or result ----------------------------------------------------


def put_mining_quality(path: Path, result: dict, protocol: str) -> int:
    """Merge ``bench/mining_quality.py``'s output under ``protocol`` (its data, steps and baseline)."""
    lines = read(path) if path.is_file() else [{"kind": "mining-quality"}]
    if lines[0].get("kind") != "mining-quality":
        raise RecordError(f"{path} holds {lines[0].get('kind')} results, not bench/mining_quality.py's")
    keep = [r for r in lines[1:] if r.get("protocol") != protocol]
    head = {"protocol": protocol, "commit": result["commit"], "baselines": [result.get("baseline", "bm25-1")]}
    head.update({k: result.get(k) for k in ("data", "limit", "steps", "document_length")})
    runs = [
        {"protocol": protocol, "arm": arm, "seed": int(seed), **run}
        for arm, by_seed in result["runs"].items()
        for seed, run in by_seed.items()
    ]
    write(path, [lines[0], *keep, head, *runs])
    return len(runs)


def mining_quality_runs(path: Path) -> dict[str, tuple[dict, dict[str, dict[int, dict]]]]:
    """``{protocol: (its line, {arm: {seed: run}})}`` in the file's order."""
    out: dict[str, tuple[dict, dict[str, dict[int, dict]]]] = {}
    for r in read(path)[1:]:
        if "arm" not in r:
            out[r["protocol"]] = (r, {})
            continue
        run = {k: v for k, v in r.items() if k not in ("protocol", "arm", "seed", "rows_trained_on")}
        run["rows"] = r.get("rows_trained_on")  # the name ``summarize`` reads, as in an nfcorpus study
        out[r["protocol"]][1].setdefault(r["arm"], {})[r["seed"]] = run
    return out


def put_named(path: Path, kind: str, name: str, result: dict) -> None:
    """One result a line, keyed by ``name``: a rerun replaces its line."""
    lines = read(path) if path.is_file() else [{"kind": kind}]
    if lines[0].get("kind") != kind:
        raise RecordError(f"{path} holds {lines[0].get('kind')} results, not {kind}")
    keep = [r for r in lines[1:] if r.get("name") != name]
    write(path, [lines[0], *sorted([*keep, {"name": name, **result}], key=lambda r: r["name"])])


def named(path: Path) -> dict[str, dict]:
    """``{name: result}`` of a one-result-a-line study."""
    return {r["name"]: {k: v for k, v in r.items() if k != "name"} for r in read(path)[1:]}


def study(name: str) -> Path:
    """A study's results file: ``lab/NAME/results.jsonl``."""
    return LAB / name / RESULTS


def bench(name: str) -> dict:
    """One benchmark's result, by its line's name in ``lab/benchmarks``."""
    return named(study("benchmarks"))[name]


def mining_protocols() -> list[tuple[str, tuple[dict, dict]]]:
    """The docstring benchmark's protocols: the quickstart first, then by budget, a fix after its first run."""
    runs = mining_quality_runs(study("mining-quality"))
    return sorted(runs.items(), key=lambda p: (p[1][0]["data"] != "quickstart", p[1][0]["steps"], p[0]))


def long_rows(path: Path):
    """An ``nfcorpus`` study as long rows (labels, split, steps, arm, seed, query, nDCG@10): the per-query
    figures, one a row, for a spreadsheet or another statistic."""
    for (labels, split, steps), arms in nfcorpus_runs(path).items():
        for arm, by_seed in arms.items():
            for seed, run in by_seed.items():
                for query, value in run.get("per_query", {}).items():
                    yield labels, split, steps, arm, seed, query, value


def best_trial(sweep: dict) -> dict | None:
    """The succeeded trial with the best metric, the first of equals: the one ``tune status`` names and stages."""
    best = None
    for t in sweep["trials"]:
        if t["state"] != "Succeeded" or t.get("metric") is None:
            continue
        if best is None or (t["metric"] > best["metric"] if sweep["goal"] == "max" else t["metric"] < best["metric"]):
            best = t
    return best
