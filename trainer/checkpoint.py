"""Atomic checkpoints that a killed pod resumes from.

Layout under ``<output_dir>/checkpoints/``::

    step-00000100/state.pt     model, optimizer, scheduler, step, every rank's RNG state
    .tmp-step-00000200/        being written; never read

Rank 0 writes into a hidden temporary directory on the same volume, fsyncs, then renames it into
place, so a directory named ``step-*`` is always complete. A checkpoint that fails to deserialise
(a dying disk, a hand-copied partial file) is renamed ``unreadable-step-*`` (kept, never deleted, and
out of the way of pruning) and the previous one is used; when none is readable, that is an error.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from trainer.config import ConfigError
from trainer.errors import JobVerdict

__all__ = [
    "CheckpointError",
    "save_checkpoint",
    "latest_checkpoint",
    "load_checkpoint",
    "list_checkpoints",
]

log = logging.getLogger(__name__)


class CheckpointError(ConfigError, JobVerdict):
    """A checkpoint that cannot be resumed by this job; reported as one line naming the fix."""


_NAME = re.compile(r"^step-(\d{8})$")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _NAME.match(p.name)) and (p / "state.pt").is_file()]
    return sorted(found)


def save_checkpoint(root: Path, step: int, state: dict[str, Any], keep_last: int) -> Path:
    """Write ``state`` for ``step`` atomically, then prune all but the newest ``keep_last``."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    with open(tmp / "state.pt", "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    if final.exists():  # same step written before a crash: the new one is as complete
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    for _, old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path) -> dict[str, Any]:
    return torch.load(path / "state.pt", map_location="cpu", weights_only=False)


def latest_checkpoint(root: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads; a damaged one is set aside (renamed, never deleted)."""
    unreadable = []
    for _step, path in reversed(list_checkpoints(root)):
        try:
            return path, load_checkpoint(path)
        except Exception as e:  # truncated by a dying disk, not by us: fall back one
            aside = path.with_name(f"unreadable-{path.name}")
            os.replace(path, aside)
            reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
            log.warning("checkpoint %s is unreadable (%s); kept as %s, trying the previous one", path, reason, aside)
            unreadable.append(f"{path.name}: {reason}")
    unreadable += [p.name for p in root.glob("unreadable-step-*")] if root.is_dir() and not unreadable else []
    if unreadable:
        raise CheckpointError(
            f"no readable checkpoint in {root} ({'; '.join(unreadable)}); they were renamed unreadable-step-*: "
            "restore a good copy, or start over with checkpoint.resume: false or a new output_dir"
        )
    return None
