"""What ``tune`` and ``tune status`` show: one record per sweep (its trials' values, states, metrics and times,
and the best so far), as a table or as JSON/YAML, the same for every engine.

A local sweep's record is read from disk each time: a trial's metric comes from its own ``metrics.json``, never
from a copy, so the best a status names is the best of what the trials wrote. A trial is finished when its
``metrics.json`` and the trainer's ``done.json`` are both there, whatever the sweep managed to record before it
was stopped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from operator_cli import show
from operator_cli.errors import CliError

__all__ = [
    "best_of",
    "duration",
    "finished",
    "local_record",
    "metric_of",
    "read_json",
    "record_text",
    "row",
    "table_head",
]

SWEEP_FILE = "sweep.json"
TRIAL_FILE = "trial.json"
LINES_FILE = "evaluations.jsonl"  # a trial's --metrics-file: its periodic evaluations, then its final one
FINAL_STATES = ("Succeeded", "Failed", "EarlyStopped")  # a local trial in one of them is never run again


def finished(output: Path) -> bool:
    """A trial's job is whole: the trainer writes ``done.json`` last, after ``metrics.json``."""
    return (output / "metrics.json").is_file() and (output / "done.json").is_file()


def metric_of(output: Path, metric: str) -> float | None:
    """The final evaluation's ``metric`` in a trial's ``metrics.json`` (None: not there)."""
    try:
        value = (json.loads((output / "metrics.json").read_text()).get("after") or {}).get(metric)
    except (OSError, ValueError):
        return None
    return float(value) if isinstance(value, (int, float)) else None


def best_of(trials: list[dict[str, Any]], goal: str) -> dict[str, Any] | None:
    """The succeeded trial with the best metric (the first of equals), or None."""
    best = None
    for t in trials:
        if t["state"] != "Succeeded" or t.get("metric") is None:
            continue
        if best is None or (t["metric"] > best["metric"] if goal == "max" else t["metric"] < best["metric"]):
            best = t
    return best


def local_record(root: Path) -> dict[str, Any]:
    """A local sweep's record, from ``root`` (``--workdir/tune/NAME``)."""
    try:
        sweep = json.loads((root / SWEEP_FILE).read_text())
    except FileNotFoundError:
        raise CliError(f"no local sweep in {root}", hint="pass the --workdir the sweep ran in", exit_code=1) from None
    except (OSError, ValueError) as e:
        raise CliError(f"{root / SWEEP_FILE} is unreadable ({type(e).__name__}); it was not written by tune") from None
    trials = []
    for t in sweep["trials"]:
        tdir = root / t["name"]
        info = read_json(tdir / TRIAL_FILE)
        output = tdir / sweep["output_dir"]
        state = "Succeeded" if finished(output) else info.get("state", "Pending")
        metric = metric_of(output, sweep["metric"]) if state == "Succeeded" else None
        if state == "Succeeded" and metric is None:
            state, info["reason"] = "Failed", f"metrics.json reports no {sweep['metric']}"
        trials.append(
            {
                "name": t["name"],
                "values": t["values"],
                "state": state,
                "metric": metric,
                "seconds": info.get("seconds"),
                "reason": info.get("reason"),
                "output": str(output),
            }
        )
    return {
        "name": sweep["name"],
        "engine": "local",
        "metric": sweep["metric"],
        "goal": sweep["goal"],
        "algorithm": sweep["algorithm"],
        "space": sweep["space"],
        "trials": trials,
        "best": best_of(trials, sweep["goal"]),
    }


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def duration(seconds: float | None) -> str:
    """``95`` -> ``1m35s``.

    >>> duration(95), duration(7), duration(None)
    ('1m35s', '7s', '')
    """
    if seconds is None:
        return ""
    minutes, sec = divmod(int(round(seconds)), 60)
    return f"{minutes}m{sec:02d}s" if minutes else f"{sec}s"


def _value(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def table_head(keys: list[str], metric: str) -> list[str]:
    return ["TRIAL", "STATE", *keys, metric.upper(), "TIME", "NOTE"]


def row(trial: dict[str, Any], keys: list[str], best: str | None = None) -> list[Any]:
    metric = "" if trial.get("metric") is None else f"{trial['metric']:.4f}"
    note = "best" if trial["name"] == best else (trial.get("reason") or "")
    return [
        trial["name"],
        trial["state"],
        *(_value(trial["values"].get(k, "")) for k in keys),
        metric,
        duration(trial.get("seconds")),
        note,
    ]


def record_text(record: dict[str, Any], output: str) -> str:
    """``tune status``: the table, then the best so far; or the record as JSON/YAML."""
    if output != "table":
        return show.formatted(record, output)
    keys = list(record["space"])
    best = record.get("best")
    rows = [row(t, keys, best and best["name"]) for t in record["trials"]]
    lines = [
        f"sweep {record['name']} ({record['engine']}, {record['algorithm']}): {record['goal']} {record['metric']}"
        f" over {', '.join(f'{k}={v}' for k, v in record['space'].items())}"
    ]
    lines.append(show.table(table_head(keys, record["metric"]), rows))
    if best:
        values = ", ".join(f"{k}={_value(v)}" for k, v in best["values"].items())
        lines.append(f"best so far: {best['name']} {record['metric']} {best['metric']:.4f} ({values})")
    else:
        lines.append("best so far: none (no trial has succeeded yet)")
    return "\n".join(lines)
