"""The line a sweep's metrics collector reads: ``colbert-train --metrics-file PATH`` appends the final
evaluation (``metrics.json``'s ``after``) to PATH as one JSON object, once the job is whole.

Katib's File collector with ``format: JSON`` reads it (``colbert-k8s tune``'s Experiments point it at
``/var/log/katib/metrics.json``): one JSON object per line, metric name to value. The values are written as
strings, the form Katib's own examples use, and names keep their ``@`` (``ndcg@10``), which a JSON key holds
as it is and the StdOut collector's default pattern would not. The numbers are ``metrics.json``'s, so the
sweep's figure for a trial is the trial's own.

>>> import json, tempfile; from pathlib import Path
>>> out = Path(tempfile.mkdtemp())
>>> _ = (out / "metrics.json").write_text(json.dumps({"after": {"ndcg@10": 0.5, "mrr@10": 0.25}}))
>>> write_metrics_line(out, out / "katib" / "metrics.json"); (out / "katib" / "metrics.json").read_text()
True
'{"ndcg@10": "0.5", "mrr@10": "0.25"}\\n'
"""

from __future__ import annotations

import json
from pathlib import Path

from trainer.config import METRICS

__all__ = ["write_metrics_line"]


def write_metrics_line(output_dir: str | Path, path: str | Path) -> bool:
    """Append the final metrics to ``path``; False (nothing written) where this pod holds no ``metrics.json``
    (a worker pod's own emptyDir) or it has no final evaluation."""
    source = Path(output_dir) / "metrics.json"
    if not source.is_file():
        return False
    after = json.loads(source.read_text()).get("after") or {}
    line = {key: repr(float(after[key])) for key in METRICS if key in after}
    if not line:
        return False
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
    return True
