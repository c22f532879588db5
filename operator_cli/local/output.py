"""What ``local`` shows of its replicas' output: one line per event, as a person reads it.

Every rank logs the same events (``[rank N] HH:MM:SS LEVEL message``, trainer/cli.py); ``local`` shows rank
0's once, and another rank's only when it warns or fails. The trainer's structured progress line
(``progress {...}``, which ``colbert-k8s status`` reads from a pod's log) becomes one readable line
(``mining round 1/2: encode corpus 3/6 · 17% · ETA 34 min``), and progress bars (tqdm's, which end in a
carriage return and run into the next log line) are left out: the progress line says the same. Lines that
are not log lines (a traceback, torchrun's own messages) pass as they are. ``local --verbose`` shows
everything as the replicas print it, as ``kubectl logs`` would.
"""

from __future__ import annotations

import json
import re

__all__ = ["eta_text", "progress_text", "shown"]

_LOG = re.compile(r"\[rank (\d+)\] (\d\d:\d\d:\d\d) (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
_BAR = re.compile(r"\d+%\|.*\|\s*\d+/\d+|\[\d+:\d\d(:\d\d)?<")  # tqdm: "17%|██   | 3/6" or "[00:05<00:10"
_PROGRESS = "progress {"


def eta_text(seconds: int) -> str:
    """``ETA 40 s``, ``ETA 34 min``, ``ETA 2 h 05 min``.

    >>> eta_text(2040), eta_text(7500), eta_text(40)
    ('ETA 34 min', 'ETA 2 h 05 min', 'ETA 40 s')
    """
    if seconds >= 3600:
        return f"ETA {seconds // 3600} h {seconds % 3600 // 60:02d} min"
    return f"ETA {round(seconds / 60)} min" if seconds >= 60 else f"ETA {seconds} s"


def progress_text(record: dict) -> str:
    """A ``progress {...}`` record (trainer/reporting/progress.py) as one line.

    >>> progress_text({"phase": "mining round 1/2: encode corpus 3/6", "percent": 17, "eta_seconds": 2040})
    'mining round 1/2: encode corpus 3/6 · 17% · ETA 34 min'
    >>> progress_text({"phase": "train step 20/40", "percent": 50, "eta_seconds": None, "loss": 0.25,
    ...                "samples_per_second": 16.0, "best": {"metric": "ndcg@10", "step": 10, "value": 0.61}})
    'train step 20/40 · 50% · loss 0.2500 · 16.0 samples/s · best ndcg@10 0.6100 at step 10'
    """
    parts = [record.get("phase") or f"step {record.get('step')}/{record.get('total')}"]
    if record.get("percent") is not None:
        parts.append(f"{record['percent']}%")
    if record.get("eta_seconds") is not None:
        parts.append(eta_text(int(record["eta_seconds"])))
    if record.get("loss") is not None:
        parts.append(f"loss {record['loss']:.4f}")
    if record.get("samples_per_second") is not None:
        parts.append(f"{record['samples_per_second']:.1f} samples/s")
    if best := record.get("best"):
        parts.append(f"best {best['metric']} {best['value']:.4f} at step {best['step']}")
    return " · ".join(parts)


def _events(line: str) -> list[str]:
    """A line cut where a log line starts in the middle of it (after a progress bar's carriage return)."""
    starts = [m.start() for m in _LOG.finditer(line) if m.start() > 0] + [len(line)]
    return [part for part in [line[: starts[0]], *(line[a:b] for a, b in zip(starts, starts[1:]))] if part.strip()]


def shown(line: str) -> list[str]:
    """The lines to show for one line of a replica's output (none, one, or a bar and a log line cut apart).

    >>> shown('[rank 1] 12:00:00 INFO scale: world size 2')
    []
    >>> shown('train:  25%|██▌       | 1/4 [00:26<01:20, 26.87s/it][rank 0] 12:00:01 WARNING slow step')
    ['[rank 0] 12:00:01 WARNING slow step']
    >>> shown('[rank 0] 12:00:02 INFO progress {"phase": "train step 1/4", "percent": 25, "eta_seconds": 80}')
    ['[rank 0] 12:00:02 INFO train step 1/4 · 25% · ETA 1 min']
    """
    out = []
    for event in _events(line.rstrip()):
        log = _LOG.match(event)
        if log is None:
            if not _BAR.search(event):
                out.append(event)
            continue
        if log.group(1) != "0" and log.group(3) in ("DEBUG", "INFO"):
            continue
        message = event[log.end() :]
        if message.startswith(_PROGRESS):
            try:
                message = progress_text(json.loads(message[len(_PROGRESS) - 1 :]))
            except (ValueError, KeyError, TypeError):
                pass
        out.append(event[: log.end()] + message)
    return out
