"""What the read commands print: a job's status record (its conditions, its pods, and its progress read
from rank 0's log), tables, and the same records as JSON or YAML (``-o``), so both show the same fields."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from operator_cli.errors import CliError
from operator_cli.kube.kinds import job_state, kind_of
from operator_cli.render import to_yaml

__all__ = ["age", "formatted", "status_record", "status_text", "table"]


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*map(str, r)).rstrip() for r in [headers, *rows])


def formatted(record: dict, output: str) -> str:
    """``record`` as JSON or YAML."""
    if output == "json":
        return json.dumps(record, indent=2)
    return to_yaml([record]).removeprefix("---\n").rstrip("\n")


def status_record(cluster, name: str) -> dict:
    """What ``status`` shows, as one record (the table and -o json/yaml are printed from it)."""
    job = cluster.get_own_job(name)
    record = {
        "name": name,
        "namespace": cluster.ns,
        "kind": job["kind"],
        "state": job_state(job),
        "conditions": [
            {k: c.get(k, "") for k in ("type", "status", "reason", "message")}
            for c in job.get("status", {}).get("conditions") or []
        ],
        "pods": [
            {
                "replica": p.replica,
                "rank": p.rank,
                "pod": p.name,
                "phase": p.phase,
                "restarts": p.restarts,
                "reason": p.reason or "",
            }
            for p in cluster.pods(job)
        ],
    }
    record["progress"] = _progress(cluster, kind_of(job), record["pods"])
    return record


def _progress(cluster, kind, pods: list[dict]) -> dict | None:
    """The newest ``progress {...}`` line of rank 0's log (trainer/reporting/progress.py), if there is one."""
    from trainer.reporting.progress import (
        LOG_PREFIX,  # it reads the trainer's config (pydantic): not at the CLI's import
    )

    master = next((p for p in pods if p["rank"] == 0 and p["phase"] != "Pending"), None)
    if master is None:
        return None
    try:
        lines = list(cluster.log_lines(master["pod"], kind, tail_lines=500))
    except CliError:  # no log yet, or no right to read it: status still shows the rest
        return None
    for line in reversed(lines):
        at = line.find(LOG_PREFIX + "{")
        if at >= 0:
            try:
                return json.loads(line[at + len(LOG_PREFIX) :])
            except ValueError:
                continue
    return None


def _progress_line(p: dict) -> str:
    """One line from the newest log line: the phase of the whole job ("mining round 2/2: encode corpus
    3/6") and the job's percentage; a line of a release before phases names the step alone."""
    eta = p.get("eta_seconds")
    head = p.get("phase") or f"step {p.get('step')}/{p.get('total')}"
    parts = [f"{head} ({p.get('percent')}%)"]
    if eta is not None:
        parts.append(
            f"ETA {eta // 3600}h{eta % 3600 // 60:02d}m" if eta >= 3600 else f"ETA {eta // 60}m{eta % 60:02d}s"
        )
    if p.get("samples_per_second") is not None:
        parts.append(f"{p['samples_per_second']:.1f} samples/s")
    if p.get("loss") is not None:
        parts.append(f"loss {p['loss']:.4f}")
    if p.get("easy_share") is not None:  # how much of the batch still teaches (trainer/losses/hardness.py)
        parts.append(f"easy rows {100 * p['easy_share']:.0f}%, margin {p['margin']:.2f}")
    if p.get("best"):
        b = p["best"]
        parts.append(f"best {b['metric']} {b['value']:.4f} at step {b['step']}")
    return "progress: " + ", ".join(parts)


def status_text(record: dict, output: str) -> str:
    if output != "table":
        return formatted(record, output)
    lines = [f"{record['name']}: {record['state']} ({record['kind']})"]
    if record.get("progress"):
        lines.append(_progress_line(record["progress"]))
    if record["conditions"]:
        rows = [[c["type"], c["status"], c["reason"], (c["message"] or "")[:80]] for c in record["conditions"]]
        lines.append(table(["CONDITION", "STATUS", "REASON", "MESSAGE"], rows))
    if record["pods"]:
        columns = ["replica", "rank", "pod", "phase", "restarts", "reason"]
        lines += ["", table([c.upper() for c in columns], [[p[c] for c in columns] for p in record["pods"]])]
    else:
        lines.append("no pods yet (the operator has not created them, or they were cleaned up)")
    return "\n".join(lines)


def age(ts: str | None) -> str:
    if not ts:
        return "-"
    seconds = int((datetime.now(timezone.utc) - datetime.fromisoformat(ts.replace("Z", "+00:00"))).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
