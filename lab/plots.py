"""The plots the docs link, drawn from the research record (``python -m lab.results`` calls them): each is a
function of the record alone, so the same record draws the same plot."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from lab.record import (
    ARM_NAMES,
    LABELS,
    PREVIOUS_ARM,
    SHIPPED_ARM,
    TUNE_SWEEP,
    bench,
    best_trial,
    mining_protocols,
    named,
    nfcorpus_runs,
    study,
)


def curves(cell_runs: dict[int, dict[str, dict[int, dict]]], seeds: list[int]) -> dict[str, dict[int, float]]:
    """``{arm: {steps: mean nDCG@10 over seeds}}``: a point only where every one of ``seeds`` ran, so every point
    of a line is the mean of the same seeds (a mean over other seeds would draw a flip that is only noise).

    >>> runs = {48: {"a": {1: {"ndcg@10": 0.25}, 2: {"ndcg@10": 0.75}}, "b": {1: {"ndcg@10": 0.1}}}}
    >>> curves(runs, [1, 2])
    {'a': {48: 0.5}}
    """
    out: dict[str, dict[int, float]] = {}
    for steps, arms in sorted(cell_runs.items()):
        for arm, by_seed in arms.items():
            if all(s in by_seed for s in seeds):
                out.setdefault(arm, {})[steps] = statistics.mean(by_seed[s]["ndcg@10"] for s in seeds)
    return out


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_nfcorpus(path: Path) -> None:
    plt = _plt()
    cells = nfcorpus_runs(study("nfcorpus-recipe"))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=False)
    names = ARM_NAMES
    for ax, labels in zip(axes, ("sparse", "full")):
        by_steps = {c[2]: arms for c, arms in cells.items() if c[0] == labels and c[1] == "test"}
        lines = curves(by_steps, [1, 2, 3])
        for color, arm in enumerate((SHIPPED_ARM, PREVIOUS_ARM, "reference", "bm25-1")):
            if arm in lines:  # one colour an arm in both panels; an arm not run in a panel is left out of it
                xs = sorted(lines[arm])
                ax.plot(xs, [lines[arm][x] for x in xs], marker="o", color=f"C{color}", label=names[arm])
        if "dense" in lines:
            ax.axhline(statistics.mean(lines["dense"].values()), color="grey", ls="--", label=names["dense"])
        ax.set_xticks(sorted(by_steps))
        ax.set_xlabel("optimizer steps (batch 16)")
        ax.set_title(f"NFCorpus test, {LABELS[labels]}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("nDCG@10, mean of seeds 1-3")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_mining_quality(path: Path) -> None:
    plt = _plt()
    protocols = [(p, hr) for p, hr in mining_protocols() if "rank-first" not in p]
    fig, axes = plt.subplots(1, len(protocols), figsize=(3.2 * len(protocols), 3.6))
    for ax, (protocol, (_, runs)) in zip(axes, protocols):
        arms = list(runs)
        for x, arm in enumerate(arms):
            values = [r["ndcg@10"] for r in runs[arm].values()]
            bm25 = arm.startswith("bm25") or arm.endswith("round 1")
            ax.bar(x, statistics.mean(values), color="#9ecae1" if bm25 else "#3182bd")
            ax.scatter([x] * len(values), values, color="black", zorder=3, s=10)
        ax.set_xticks(range(len(arms)), arms, rotation=40, fontsize=7, ha="right")
        low = min(r["ndcg@10"] for a in arms for r in runs[a].values())
        ax.set_ylim(low - 0.02, None)
        ax.set_title(f"{protocol}", fontsize=8)
    axes[0].set_ylabel("held-out nDCG@10 (light: BM25 negatives)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_crossover(path: Path) -> None:
    plt = _plt()
    r = bench("mine-crossover")
    docs = [row["documents"] for row in r["rows"]]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for key, label in (("exact", "exact MaxSim"), ("plaid", "PLAID")):
        ax.plot(docs, [row[key]["search_seconds"] for row in r["rows"]], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("documents")
    ax.set_ylabel(f"search seconds, {r['queries']} queries")
    ax.set_title(f"search cost against corpus size (commit {r['commit']})", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_speed(path: Path) -> None:
    plt = _plt()
    r = bench("speed")
    fig, ax = plt.subplots(figsize=(6, 3.4), dpi=120)
    nprocs, width = list(r["runs"]), 0.38
    for i, (key, label) in enumerate(
        (("reference_samples_per_second", "PyLate how-to recipe"), ("ours_samples_per_second", "colbert-train"))
    ):
        med = [r["runs"][n][key]["median"] for n in nprocs]
        err = [
            [m - r["runs"][n][key]["min"] for n, m in zip(nprocs, med)],
            [r["runs"][n][key]["max"] - m for n, m in zip(nprocs, med)],
        ]
        ax.bar([j + (i - 0.5) * width for j in range(len(nprocs))], med, width, yerr=err, capsize=3, label=label)
    ax.set_xticks(range(len(nprocs)), [f"{n} process{'es' if n != '1' else ''}" for n in nprocs])
    ax.set_ylabel("training samples / s")
    ax.set_title(f"all-MiniLM-L6-v2 ColBERT, per-device batch {r['per_device_batch']}, 2-core CPU")
    top = max(
        r["runs"][n][k]["max"] for n in nprocs for k in ("ours_samples_per_second", "reference_samples_per_second")
    )
    ax.set_ylim(0, top * 1.3)
    ax.legend(loc="upper center", ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


def plot_memory(path: Path) -> None:
    plt = _plt()
    import matplotlib.ticker

    r = bench("memory")
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    for loss, by_batch in r["peak_rss_mb"].items():
        measured = {int(b): s for b, s in by_batch.items() if "median" in s}
        xs = sorted(measured)
        (line,) = ax.plot(xs, [measured[x]["median"] / 1024 for x in xs], marker="o", label=loss)
        lows, highs = [measured[x]["min"] / 1024 for x in xs], [measured[x]["max"] / 1024 for x in xs]
        ax.fill_between(xs, lows, highs, alpha=0.2, color=line.get_color())
        for b, s in by_batch.items():
            if s.get("skipped"):  # projected, not measured: dashed line, hollow marker
                ys = [measured[xs[-1]]["median"] / 1024, s["projected"] / 1024]
                ax.plot(
                    [xs[-1], int(b)],
                    ys,
                    ls="--",
                    marker="o",
                    mfc="none",
                    color=line.get_color(),
                    label=f"{loss} (projected: 2 processes do not fit in RAM)",
                )
    ax.set_xscale("log", base=2)
    ax.set_xticks([int(b) for b in next(iter(r["peak_rss_mb"].values()))])
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("global batch (2 processes)")
    ax.set_ylabel("peak RSS per process (GiB)")
    ax.set_title(f"Memory vs global batch (mini-batch {r['mini_batch']} for cached)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def plot_data_scale(path: Path) -> None:
    plt = _plt()
    r = bench("data-scale")
    runs = [x for x in r["runs"] if not x["pretokenize"] and x["documents_per_query"] == 2]
    rows = [x["rows"] for x in runs]
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3.2), dpi=120)
    a.plot(rows, [x["first_step_seconds"] for x in runs], "o-", label="streaming (Arrow)")
    b.plot(rows, [max(x["peak_rss_mb"]) for x in runs], "o-", label="streaming (Arrow)")
    if old := [x for x in r["runs"] if x["pretokenize"]]:
        a.plot([x["rows"] for x in old], [x["first_step_seconds"] for x in old], "s", label="pretokenize (measured)")
        b.plot([x["rows"] for x in old], [max(x["peak_rss_mb"]) for x in old], "s", label="pretokenize (measured)")
    for ax, title in ((a, "seconds to the first optimizer step"), (b, "peak RSS per rank, MiB")):
        ax.set_xscale("log")
        ax.set_xlabel("training rows")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    a.axhline(60, color="grey", ls="--", lw=0.8)
    a.set_ylim(0, 65)
    a.text(rows[0], 61, "target: 60 s", fontsize=7, color="grey")
    a.legend(fontsize=7)
    fig.suptitle("2 CPU processes, all-MiniLM-L6-v2, query 32 / document 180 tokens", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)


def plot_elastic(path: Path) -> None:
    plt = _plt()
    r = bench("elastic-curve")
    fig, ax = plt.subplots(figsize=(6, 3.4))
    for key, label, style in (("uninterrupted", "2 processes, uninterrupted", "-"), ("resumed", "resumed", "--")):
        steps = sorted(int(s) for s in r[key])
        ax.plot(steps, [r[key][str(s)] for s in steps], style, marker=".", label=label)
    ax.axvline(r["stop_after"] + 0.5, color="grey", lw=0.8)
    ax.text(r["stop_after"] + 0.7, ax.get_ylim()[1] * 0.95, "stopped; resumed on 1 process", fontsize=7)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.set_title(f"elastic resume, dropout on (commit {r['commit']})", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_serving(path: Path) -> None:
    """The record's serving run, drawn by :func:`draw_serving`."""
    draw_serving(bench("serving"), path)


def draw_serving(r: dict, path: Path) -> None:
    """Answered against offered q/s, and p50/p99 latency, against clients: one line a request kind. ``r``:
    bench/serve.py's result (the record's line, or a run's own)."""
    plt = _plt()
    fig, (rate, latency) = plt.subplots(1, 2, figsize=(9, 3.4), dpi=120)
    for mode in dict.fromkeys(x["mode"] for x in r["rows"]):
        rows = [x for x in r["rows"] if x["mode"] == mode]
        clients = [x["clients"] for x in rows]
        line = rate.plot(clients, [x["qps"] for x in rows], marker="o", label=mode)[0]
        rate.plot(clients, [x["offered_qps"] for x in rows], ls=":", color=line.get_color())
        latency.plot(clients, [x["p50_ms"] for x in rows], marker="o", color=line.get_color())
        latency.plot(clients, [x["p99_ms"] for x in rows], marker="^", ls="--", color=line.get_color())
    rate.set(xscale="log", xlabel="clients", ylabel="answered q/s (dotted: offered)")
    latency.set(xscale="log", yscale="log", xlabel="clients", ylabel="latency ms (dashed: p99)")
    for ax in (rate, latency):
        ax.grid(alpha=0.3)
    rate.legend(fontsize=7)
    fig.suptitle(
        f"serve --local, {r['documents']} documents, {r['device']}, open loop (commit {r['commit']})", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path)


def plot_corpus_scale(path: Path) -> None:
    """The index phase's build seconds and peak RSS, and search latency, against the corpus's size."""
    plt = _plt()
    r = bench("corpus-scale")
    runs = [x for x in r["runs"] if not x.get("skipped")]
    docs = [x["documents"] for x in runs]
    fig, (cost, memory, latency) = plt.subplots(1, 3, figsize=(11, 3.4), dpi=120)
    cost.plot(docs, [x["build_seconds"] for x in runs], "o-")
    memory.plot(docs, [x["peak_rss_mb"] for x in runs], "o-", label="peak RSS of the build")
    memory.plot(docs, [x["index_mb"] for x in runs], "s--", label="the index")
    largest = max((x for x in runs if x.get("chunk_peak_rss_mb")), key=lambda x: x["documents"], default=None)
    if largest:  # where the peak falls: the first chunk's k-means, then each update as the index grows
        peaks = largest["chunk_peak_rss_mb"]
        added = [min((i + 1) * r["chunk"], largest["documents"]) for i in range(len(peaks))]
        memory.plot(added, peaks, ".:", label=f"peak while adding each chunk ({largest['documents']:,} build)")
    latency.plot(docs, [x["in_process"]["p50_ms"] for x in runs], "o-", label="in-process p50")
    for i, n in enumerate(c["clients"] for c in runs[0]["served"]):
        # a p99 over the few requests answered in time is not the service's: such a cell is marked, not drawn
        cells = [(x["documents"], x["served"][i]) for x in runs]
        kept = [(d, c) for d, c in cells if c["ok"] >= c["requests"] / 2]
        line = latency.plot(
            [d for d, _ in kept], [c["p99_ms"] for _, c in kept], "^--", label=f"served p99, {n} client{'s' * (n > 1)}"
        )
        for d, c in cells:
            if c["ok"] < c["requests"] / 2:
                latency.annotate(
                    f"{n} clients: {c['ok']} of {c['requests']} answered",
                    (d, c["p99_ms"]),
                    fontsize=7,
                    color=line[0].get_color(),
                    ha="right",
                )
    for ax, title in ((cost, "build seconds"), (memory, "MiB"), (latency, "search latency, ms")):
        ax.set_xscale("log")
        ax.set_xlabel("documents")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    latency.set_yscale("log")
    memory.set_ylim(bottom=0)
    memory.legend(fontsize=7)
    latency.legend(fontsize=7)
    fig.suptitle(
        f"{r['encoder']}, synthetic corpus, {r['chunk']:,} documents a chunk (commits: docs/benchmarks.md)", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path)


def plot_tune(path: Path) -> None:
    """docs/tune.md's sweep, drawn by ``bench/tune_plot.py`` (what draws any ``tune status -o json``) from its line."""
    from bench.tune_plot import plot

    name, line = TUNE_SWEEP
    sweep = {"name": line, **named(study(name))[line]}
    plot({**sweep, "best": best_trial(sweep)}, path)


PLOTS: dict[str, Callable[[Path], None]] = {
    "serving.png": plot_serving,
    "corpus_scale.png": plot_corpus_scale,
    "nfcorpus_recipe.png": plot_nfcorpus,
    "mining_quality.png": plot_mining_quality,
    "mining_crossover.png": plot_crossover,
    "speed.png": plot_speed,
    "memory.png": plot_memory,
    "data_scale.png": plot_data_scale,
    "elastic_curve.png": plot_elastic,
    "tune_nfcorpus.png": plot_tune,
}
