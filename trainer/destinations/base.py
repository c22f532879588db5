"""What every uploader shares: the manifest's and the marker's names, the two errors and what a client's error
means in words. ``trainer/storage/export.py`` re-exports them (its callers' names)."""

from __future__ import annotations

import json

from trainer.config.schema import ConfigError
from trainer.storage.stores import reason

__all__ = ["MANIFEST", "PARTIAL", "ExportError", "ExportFailed", "files_of", "reason_of"]

MANIFEST = "colbert-k8s-export.json"  # written last: a destination without it holds no export
PARTIAL = "colbert-k8s-export.partial"  # there while an export is written: a reader refuses the prefix


class ExportError(ConfigError):
    """A destination that cannot be exported to: found at start, one line naming the fix, exit 2."""


class ExportFailed(Exception):
    """The upload failed after the store's retries: one line, exit ``EXIT_EXPORT``; a restart retries."""


def reason_of(e: BaseException) -> str:
    """What a store's error means, in words, where its text says; else :func:`trainer.storage.stores.reason`."""
    text = str(e)
    for said, means in (
        ("NoSuchBucket", "the bucket does not exist"),
        ("AccessDenied", "access denied"),
        ("InvalidAccessKeyId", "the access key is not known"),
        ("SignatureDoesNotMatch", "the secret key does not match"),
        ("169.254.169.254", "no credentials: none in the environment, and no instance metadata"),
    ):
        if said in text:
            return means
    return reason(e)


def files_of(manifest: bytes) -> list[str]:
    """The file names an export's manifest lists (none when it does not parse)."""
    try:
        return list(json.loads(manifest).get("files", {}))
    except (ValueError, AttributeError):
        return []
