"""Files and directories that appear whole or not at all: written under a temporary name, then renamed.

A reader (a resumed rank, ``colbert-k8s local``'s summary, the next stage of a job) never sees half a
file, whatever kills the writer. Every write of the trainer (a file here, a checkpoint, a model, an index, the
marker, the Arrow rows) runs inside :func:`whole_or_absent`: a failure removes the temporary, and a full disk is
:class:`~trainer.errors.DiskFull`'s one line naming the path. Checkpoints add fsyncs on top of this
(``trainer/run/checkpoint.py``).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trainer.errors import DiskFull, no_space

__all__ = ["replace_dir", "replacing", "sha256_of", "whole_or_absent", "write_text"]


@contextmanager
def whole_or_absent(tmp: Path, named: Path | None = None, need: int | None = None) -> Iterator[Path]:
    """Write ``tmp`` (a file or a directory) in the block: if it fails, ``tmp`` is removed, and a full disk or a
    read-only volume, however the writer wrapped it (torch.save, pyarrow, safetensors), is :class:`DiskFull`'s
    one line naming ``named`` (default ``tmp``; ``need``: the bytes it takes, when known). The one place where
    a write of the trainer turns a full disk into the line the job ends with."""
    try:
        yield tmp
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
        if isinstance(e, Exception) and not isinstance(e, DiskFull) and (cause := no_space(e)):
            raise DiskFull.of(cause, named or tmp, need) from None
        raise


@contextmanager
def replacing(path: Path, need: int | None = None) -> Iterator[Path]:
    """A temporary sibling of ``path`` to write; renamed to ``path`` if the block ends normally, removed
    if not. The name is unique across pods that share a volume and may run the same PID. A full disk
    (``need``: the bytes it takes, when known) raises :class:`DiskFull` naming ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    with whole_or_absent(tmp, path, need):
        path.parent.mkdir(parents=True, exist_ok=True)
        yield tmp
        os.replace(tmp, path)


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary sibling and one rename."""
    with replacing(path, len(text.encode())) as tmp:
        tmp.write_text(text)


def replace_dir(tmp: Path, final: Path) -> None:
    """Move a finished directory into place; an existing one is kept aside until the move succeeded."""
    old = final.with_name(f".old-{final.name}-{os.getpid()}")
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def sha256_of(path: Path) -> str:
    """The file's sha256, read in blocks: what every manifest records (checkpoints, models, the index, exports)
    and what a reader checks a file against."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()
