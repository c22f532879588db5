"""Files and directories that appear whole or not at all: written under a temporary name, then renamed.

A reader (a resumed rank, ``colbert-k8s local``'s summary, the next stage of a job) never sees half a
file, whatever kills the writer. Checkpoints add fsyncs on top of this (``checkpoint.py``).
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["replace_dir", "replacing", "write_text"]


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary sibling of ``path`` to write; renamed to ``path`` if the block ends normally, removed
    if not. The name is unique across pods that share a volume and may run the same PID."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary sibling and one rename."""
    with replacing(path) as tmp:
        tmp.write_text(text)


def replace_dir(tmp: Path, final: Path) -> None:
    """Move a finished directory into place; an existing one is kept aside until the move succeeded."""
    old = final.with_name(f".old-{final.name}-{os.getpid()}")
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
