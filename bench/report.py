"""Turn bench/results/*.json into the tables of docs/benchmarks.md and docs/memory.png.

python bench/report.py      # prints the Markdown tables; writes docs/memory.png
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def _fmt(s: dict, digits: int = 2) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def speed_table(r: dict) -> str:
    lines = [
        "| processes | colbert-train samples/s | reference samples/s | loop ratio (ours / reference) "
        "| wall ratio | colbert-train wall s | reference wall s | HF's counter for the reference |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for nproc, run in r["runs"].items():
        ours, ref, ratio = run["ours_samples_per_second"], run["reference_samples_per_second"], run["ratio"]
        walls = f"{_fmt(run['ours_wall_seconds'], 1)} | {_fmt(run['reference_wall_seconds'], 1)}"
        hf = _fmt(run["reference_hf_counter_samples_per_second"])
        lines.append(
            f"| {nproc} | {_fmt(ours)} | {_fmt(ref)} | **{_fmt(ratio)}** | {_fmt(run['wall_ratio'])} | {walls} | {hf} |"
        )
    return "\n".join(lines)


def scaling_table(r: dict) -> str:
    one, two = r["scaling"]["1"], r["scaling"]["2"]
    g = r["scaling_global_batch"]
    return "\n".join(
        [
            f"| layout (global batch {g}) | samples/s |",
            "|---|---|",
            f"| 1 process x {g} | {_fmt(one)} |",
            f"| 2 processes x {g // 2} | {_fmt(two)} |",
            f"| speed-up (medians) | {two['median'] / one['median']:.2f}x |",
        ]
    )


def _cell(s: dict) -> str:
    if s.get("skipped"):
        return f"not run: ≈{s['projected']:.0f} projected, x2 processes exceeds RAM"
    return f"{s['median']:.0f} ({s['min']:.0f}–{s['max']:.0f})"


def memory_table(r: dict) -> str:
    batches = list(next(iter(r["peak_rss_mb"].values())))
    lines = [
        "| loss | " + " | ".join(f"global batch {b}" for b in batches) + " | growth 64 → 1024 |",
        "|---|" + "---|" * (len(batches) + 1),
    ]
    for loss, by_batch in r["peak_rss_mb"].items():
        cells = [_cell(by_batch[b]) for b in batches]
        last = by_batch[batches[-1]]
        growth = last.get("median", last.get("projected")) / by_batch[batches[0]]["median"] - 1
        lines.append(f"| {loss} | " + " | ".join(cells) + f" | {'≈' if 'projected' in last else ''}{growth:+.0%} |")
    return "\n".join(lines)


def memory_plot(r: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.savefig(out)


def speed_plot(r: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4), dpi=120)
    nprocs = list(r["runs"])
    width = 0.38
    for i, (key, label) in enumerate(
        (("reference_samples_per_second", "PyLate how-to recipe"), ("ours_samples_per_second", "colbert-train"))
    ):
        med = [r["runs"][n][key]["median"] for n in nprocs]
        err = [
            [m - r["runs"][n][key]["min"] for n, m in zip(nprocs, med)],
            [r["runs"][n][key]["max"] - m for n, m in zip(nprocs, med)],
        ]
        xs = [j + (i - 0.5) * width for j in range(len(nprocs))]
        ax.bar(xs, med, width, yerr=err, capsize=3, label=label)
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
    fig.savefig(out)


def data_scale_table(r: dict) -> str:
    lines = [
        "| rows | docs/query | path | file MiB | one-time conversion s | of which the row hash s "
        "| first step s (whole process) | peak RSS MiB per rank | worker peak RSS MiB | steady samples/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    num = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
    for run in r["runs"]:
        path = "pretokenize (in memory)" if run["pretokenize"] else "streaming (Arrow)"
        conv, hashing = num(run["convert_seconds"], ".1f"), num(run.get("hash_seconds"), ".1f")
        rss = " / ".join(f"{x:.0f}" for x in run["peak_rss_mb"] or [])
        workers = " / ".join(f"{x:.0f}" for x in run["worker_peak_rss_mb"] or [])
        lines.append(
            f"| {run['rows']:,} | {run['documents_per_query']} | {path} | {run['file_mib']} | {conv} | {hashing} "
            f"| {num(run['first_step_seconds'], '.1f')} | {rss} | {workers} "
            f"| {num(run['steady_samples_per_second'], '.2f')} |"
        )
    return "\n".join(lines)


def data_scale_plot(r: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [x for x in r["runs"] if not x["pretokenize"] and x["documents_per_query"] == 2]
    rows = [x["rows"] for x in runs]
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3.2), dpi=120)
    a.plot(rows, [x["first_step_seconds"] for x in runs], "o-", label="streaming (Arrow)")
    b.plot(rows, [max(x["peak_rss_mb"]) for x in runs], "o-", label="streaming (Arrow)")
    old = [x for x in r["runs"] if x["pretokenize"]]
    if old:
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
    fig.savefig(out)


def main() -> None:
    scale = RESULTS / "data_scale.json"
    if scale.is_file():
        r = json.loads(scale.read_text())
        data_scale_plot(r, ROOT / "docs" / "data_scale.png")
        print(f"## data scale (commit {r['commit']})\n\n{data_scale_table(r)}\n")
    speed = RESULTS / "speed.json"
    memory = RESULTS / "memory.json"
    if speed.is_file():
        r = json.loads(speed.read_text())
        speed_plot(r, ROOT / "docs" / "speed.png")
        print(f"## speed (commit {r['commit']})\n\n{speed_table(r)}\n\n{scaling_table(r)}\n")
    if memory.is_file():
        r = json.loads(memory.read_text())
        memory_plot(r, ROOT / "docs" / "memory.png")
        print(f"## memory (commit {r['commit']})\n\n{memory_table(r)}\n")


if __name__ == "__main__":
    main()
