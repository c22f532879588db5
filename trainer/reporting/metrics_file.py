"""The lines a sweep's metrics collector reads: ``colbert-train --metrics-file PATH`` appends one JSON object per
evaluation to PATH: every periodic evaluation (``evaluation.every_steps``) as it happens, then the final one
(``metrics.json``'s ``after``) once the job is whole, marked ``"final"``.

Katib's File collector with ``format: JSON`` reads them (``colbert-k8s tune``'s Experiments point it at
``/var/log/katib/metrics.json``): one JSON object per line, metric name to value. The values are written as
strings, the form Katib's own examples use (it skips a metric whose value is not a string), and names keep
their ``@`` (``ndcg@10``), which a JSON key holds as it is and the StdOut collector's default pattern would
not. Each line has a ``timestamp`` (RFC 3339, UTC): Katib orders a trial's values by it, and its median stop
needs that order; without one, every value would have the same zero time. The intermediate lines are what
median stopping acts on (Katib's ``medianstop``, ``colbert-k8s tune --local --early-stop median``); the final
line is the trial's figure, the same numbers as its ``metrics.json``.

>>> import json, tempfile; from pathlib import Path
>>> out = Path(tempfile.mkdtemp()); path = out / "katib" / "metrics.json"
>>> _ = append_line(path, {"ndcg@10": 0.25, "loss": 1.5}, step=16, now="2026-12-02T16:00:00.000000Z")
>>> _ = (out / "metrics.json").write_text(json.dumps({"steps": 48, "after": {"ndcg@10": 0.5, "mrr@10": 0.25}}))
>>> write_metrics_line(out, path, now="2026-12-02T16:10:00.000000Z")
True
>>> print(path.read_text(), end="")
{"ndcg@10": "0.25", "step": "16", "timestamp": "2026-12-02T16:00:00.000000Z"}
{"ndcg@10": "0.5", "mrr@10": "0.25", "step": "48", "final": "true", "timestamp": "2026-12-02T16:10:00.000000Z"}
>>> [(line["step"], line["final"]) for line in read_lines(path)]
[(16, False), (48, True)]
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trainer.config.schema import METRICS

__all__ = ["append_line", "read_lines", "write_metrics_line"]


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def append_line(
    path: str | Path, result: dict[str, float], step: int, final: bool = False, now: str | None = None
) -> bool:
    """Append one evaluation's metrics (those of :data:`METRICS` it has) as a line; False when it has none."""
    line: dict[str, str] = {key: repr(float(result[key])) for key in METRICS if key in result}
    if not line:
        return False
    line["step"] = str(step)
    if final:
        line["final"] = "true"
    line["timestamp"] = now or _now()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
        f.flush()  # a collector tails the file while the trial runs
    return True


def write_metrics_line(output_dir: str | Path, path: str | Path, now: str | None = None) -> bool:
    """Append the final metrics to ``path``; False (nothing written) where this pod holds no ``metrics.json``
    (a worker pod's own emptyDir) or it has no final evaluation."""
    source = Path(output_dir) / "metrics.json"
    if not source.is_file():
        return False
    metrics = json.loads(source.read_text())
    return append_line(path, metrics.get("after") or {}, int(metrics.get("steps") or 0), final=True, now=now)


def read_lines(path: str | Path) -> list[dict[str, Any]]:
    """The lines written so far, as numbers (``step``, each metric) and ``final`` (a bool); a line still being
    written (no newline yet) or unreadable is left out."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        return []
    lines = []
    for raw in text.splitlines(keepends=True):
        if not raw.endswith("\n"):
            continue
        try:
            line = json.loads(raw)
            parsed = {key: float(line[key]) for key in METRICS if key in line}
            parsed.update(step=int(line["step"]), final=line.get("final") == "true")
        except (ValueError, KeyError, TypeError):
            continue
        lines.append(parsed)
    return lines
