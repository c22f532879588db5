"""Atomic checkpoints that a killed pod resumes from.

Layout under ``<output_dir>/checkpoints/``::

    step-00000100/state.pt       the state (``resume.capture``), a dict of these keys:
        format             CHECKPOINT_FORMAT: what the keys mean; another is refused in one line
        step               optimizer steps done (the data position: batches are a function of (seed, step))
        world_size         ranks of the job that wrote it (another needs training.global_batch_size)
        model              the ColBERT model's state dict (rank 0's; every rank's is checked equal)
        optimizer          AdamW's state dict (moments, step counts)
        scheduler          the learning-rate schedule's state dict
        scaler             fp16's GradScaler state dict, or None
        rng                every rank's RNG streams, in rank order (CPU, Python, its own CUDA device)
        config             the config that wrote it (keys that must match, ``resume._MUST_MATCH``)
        metrics            metrics so far (the evaluation before training, the best so far)
        data               the identity of the rows trained on (``Rows.identity``: every row), checked on resume
        skipped_nonfinite  non-finite steps skipped so far (training.skip_nonfinite_steps is per job)
    step-00000100/manifest.json  the format version, and the size and sha256 of state.pt: written last
    .tmp-step-00000200/          being written; never read

Rank 0 writes into a hidden temporary directory on the same volume, fsyncs, then renames it into
place, so a directory named ``step-*`` is always complete. Before loading, the manifest is checked:
a checkpoint whose bytes are not what was written (a flipped bit, a truncated copy) is renamed
``corrupt-step-*``, one that fails to deserialise ``unreadable-step-*`` (both kept, never deleted, out
of the way of pruning), and the previous one is tried; when none is good, that is an error. A damaged
manifest (not JSON, another shape, a key missing) makes its checkpoint corrupt alike, and so does a
manifest of another format beside a state.pt of this one (a flipped bit in "format": the job was refused,
its good previous checkpoint never tried). A checkpoint whose state.pt is of another ``CHECKPOINT_FORMAT``
too is refused in one line; one written before manifests existed is loaded unverified, with a warning.
The state carries the format too (checked by ``resume.check_compatible``), so a state.pt copied without
its manifest is refused alike.

The same manifest proves the final model, ``best-model`` and the index whole (``trainer/phases.py``):
there, :func:`verify` with ``required=True`` treats a missing manifest as not whole.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from trainer.atomic import sha256_of, whole_or_absent
from trainer.config.schema import ConfigError
from trainer.errors import DiskFull, JobVerdict

__all__ = [
    "CHECKPOINT_FORMAT",
    "CheckpointError",
    "save_checkpoint",
    "latest_checkpoint",
    "load_checkpoint",
    "list_checkpoints",
    "remove_stale_temporaries",
    "verify",
    "write_manifest",
]

log = logging.getLogger(__name__)


class CheckpointError(ConfigError, JobVerdict):
    """A checkpoint that cannot be resumed by this job; reported as one line naming the fix."""


_NAME = re.compile(r"^step-(\d{8})$")
CHECKPOINT_FORMAT = 1  # bump when the state's keys change meaning; a checkpoint of another is refused
_MANIFEST = "manifest.json"


def write_manifest(directory: Path, files: list[str] | None = None, name: str = _MANIFEST) -> None:
    """The size and sha256 of each of ``files`` (default: every file under ``directory``, by relative path)
    and the format version, fsynced: the directory's last file, so its presence says the writer finished."""
    if files is None:
        files = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())
        files = [f for f in files if f != name]
    manifest = {
        "format": CHECKPOINT_FORMAT,
        "files": {n: {"size": (directory / n).stat().st_size, "sha256": sha256_of(directory / n)} for n in files},
    }
    with open(directory / name, "w") as f:
        f.write(json.dumps(manifest, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())


def verify(directory: Path, required: bool = False, name: str = _MANIFEST) -> str | None:
    """Why ``directory`` is not what its manifest says (None: it is, or it has no manifest and none is
    ``required``); a damaged manifest is such a reason, never a crash. A manifest of another format raises
    :class:`CheckpointError` (``latest_checkpoint`` tells a newer trainer's from a flipped bit)."""
    try:
        manifest = json.loads((directory / name).read_text())
    except FileNotFoundError:
        return f"it has no {name} (its writer did not finish)" if required else None
    except (OSError, ValueError, RecursionError) as e:
        return f"its {name} is unreadable ({type(e).__name__}: {str(e)[:80]})"
    if not isinstance(manifest, dict):
        return f"its {name} is not a manifest (a JSON {type(manifest).__name__})"
    if manifest.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"{directory} has format {manifest.get('format')!r}, this trainer reads format "
            f"{CHECKPOINT_FORMAT}; resume it with the colbert-k8s version that wrote it, or use a new output_dir"
        )
    if problem := _damaged(manifest, name):
        return problem
    for file, want in manifest["files"].items():
        path = directory / file
        if not path.is_file():
            return f"{file} is missing"
        if path.stat().st_size != want["size"]:
            return f"{file} holds {path.stat().st_size} bytes, the manifest says {want['size']}"
        if sha256_of(path) != want["sha256"]:
            return f"{file} does not match its sha256 (the bytes changed after they were written)"
    return None


def _damaged(manifest: dict, name: str) -> str | None:
    """Why a manifest of this format is not one that :func:`write_manifest` could have written (a flipped bit
    in a key: "rize" for "size"), or None. A KeyError here crashed every start."""
    files = manifest.get("files")
    if not isinstance(files, dict):
        return f"its {name} lists no files"
    for file, want in files.items():
        relative = PurePosixPath(file)
        if relative.is_absolute() or ".." in relative.parts or not relative.parts:
            return f"its {name} names {file[:60]!r}, not a file inside the directory"
        if not isinstance(want, dict) or type(want.get("size")) is not int or not isinstance(want.get("sha256"), str):
            return f"its {name} gives no size and sha256 for {file[:60]!r}"
    return None


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
    previous = list_checkpoints(root)
    need = (previous[-1][1] / "state.pt").stat().st_size if previous else None
    if need and shutil.disk_usage(root).free < need:  # cheap to know: fail before writing, not midway
        raise DiskFull.of(OSError(errno.ENOSPC, "not enough free space for another checkpoint"), tmp, need)
    with whole_or_absent(tmp, need=need):  # torch.save's writer wraps the OSError in a RuntimeError
        tmp.mkdir()
        with open(tmp / "state.pt", "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        write_manifest(tmp, ["state.pt"])
        _fsync_dir(tmp)
        if final.exists():  # same step written before a crash: the new one is as complete
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
    for _, old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def remove_stale_temporaries(output_dir: Path) -> list[Path]:
    """Remove what killed writers left: ``checkpoints/.tmp-step-*`` and ``.tmp-*`` model and index directories.
    Called by rank 0 at start, when nothing of this job writes yet (one job owns its output_dir)."""
    stale = [*output_dir.glob("checkpoints/.tmp-step-*"), *output_dir.glob(".tmp-*")] if output_dir.is_dir() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    if stale:
        log.info("removed %d temporary file(s) a killed run left in %s", len(stale), output_dir)
    return stale


def load_checkpoint(path: Path) -> dict[str, Any]:
    return torch.load(path / "state.pt", map_location="cpu", weights_only=False)


def _aside(path: Path, why: str) -> Path:
    """``why-step-N``, or ``why-step-N.2`` and on when one was set aside before (step N rewritten, bad again)."""
    aside, n = path.with_name(f"{why}-{path.name}"), 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{why}-{path.name}.{n}")
    return aside


def _own_format(path: Path) -> object:
    """The ``format`` state.pt holds itself (memory-mapped: its tensors are not read), or None when it does not load."""
    try:
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=False, mmap=True)
    except Exception:  # what a damaged or foreign file raises is anyone's guess
        return None
    return state.get("format", CHECKPOINT_FORMAT) if isinstance(state, dict) else None


def _verified(path: Path) -> str | None:
    """:func:`verify` for a checkpoint: a manifest of another format beside a state.pt of this one is a flipped bit
    in the manifest (corrupt: the previous checkpoint is tried), not a newer trainer's checkpoint (refused)."""
    try:
        return verify(path)
    except CheckpointError:
        if _own_format(path) != CHECKPOINT_FORMAT:
            raise
        return f"its {_MANIFEST} names another format than its state.pt's, {CHECKPOINT_FORMAT} (a damaged manifest)"


def latest_checkpoint(root: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that is what was written and loads; a damaged one (its manifest included) is set
    aside (renamed, never deleted) and the one before it is tried."""
    unreadable = []
    for _step, path in reversed(list_checkpoints(root)):
        if problem := _verified(path):
            aside = _aside(path, "corrupt")
            os.replace(path, aside)
            log.warning("checkpoint %s is corrupt (%s); kept as %s, trying the previous one", path, problem, aside)
            unreadable.append(f"{path.name}: {problem}")
            continue
        if not (path / _MANIFEST).is_file():
            log.warning("checkpoint %s has no manifest (written before 0.3): loading it unverified", path)
        try:
            return path, load_checkpoint(path)
        except Exception as e:  # truncated by a dying disk, not by us: fall back one
            aside = _aside(path, "unreadable")
            os.replace(path, aside)
            reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
            log.warning("checkpoint %s is unreadable (%s); kept as %s, trying the previous one", path, reason, aside)
            unreadable.append(f"{path.name}: {reason}")
    if root.is_dir() and not unreadable:
        unreadable += [p.name for p in (*root.glob("unreadable-step-*"), *root.glob("corrupt-step-*"))]
    if unreadable:
        raise CheckpointError(
            f"no readable checkpoint in {root} ({'; '.join(unreadable)[:400]}); they were renamed "
            "corrupt-step-* or unreadable-step-*: "
            "restore a good copy, or start over with checkpoint.resume: false or a new output_dir"
        )
    return None
