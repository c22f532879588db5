"""Export to an object store (``s3://``, ``gs://``, ``az://``) through obstore: a probe object at start; then
the marker, the files (resumable through a journal of ETags), the earlier export's leftovers removed, and the
manifest last (``trainer/storage/export.py`` says why)."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from trainer.atomic import write_text
from trainer.config.base import Destination
from trainer.destinations.base import MANIFEST, PARTIAL, ExportError, ExportFailed, files_of, reason_of
from trainer.redirects import Redirected
from trainer.storage.stores import bucket_store

__all__ = ["ObjectStore"]

log = logging.getLogger("trainer")

JOURNAL = ".export-journal.json"  # in output_dir: what an earlier start uploaded
_CHUNK = 8 << 20


class ObjectStore:
    """The uploader of a bucket's prefix."""

    def preflight(self, cfg: Any, dest: Destination, hint: str | None) -> None:
        # no credentials in the environment may still mean workload identity: the probe decides
        _probe_store(dest, hint and hint + " (or workload identity)")

    def upload(
        self, cfg: Any, dest: Destination, plan: dict[str, Path], manifest: dict, done: Callable[[], None]
    ) -> int:
        return _upload_store(dest, plan, manifest, Path(cfg.output_dir) / JOURNAL, done)

    def steps(self, plan: dict[str, Path]) -> int:
        return len(plan)


def _store(dest: Destination, probe: bool = False):
    """An obstore store for the bucket, configured from the environment (as trainer/storage/sources.py reads). The
    probe's is quick to give up (a server that never answers must not hold the start for minutes); the
    upload's retries transient errors with the store's own backoff."""
    options = {"timeout": "30s" if probe else "300s", "connect_timeout": "10s"}
    if probe:
        retry = {"max_retries": 1, "retry_timeout": timedelta(seconds=60)}
    else:
        retry = {"max_retries": 10, "retry_timeout": timedelta(minutes=10)}
    try:
        return bucket_store(dest.scheme, dest.bucket, options, retry_config=retry)
    except Redirected as e:  # a custom endpoint that redirects elsewhere (trainer/redirects.py)
        raise ExportError(f"export.destination {dest}: {e}") from None
    except Exception as e:  # a builder's complaint: no account (az://), a bad endpoint, ...
        raise ExportError(f"export.destination {dest}: cannot be opened ({reason_of(e)})") from None


def _probe_store(dest: Destination, hint: str | None) -> None:
    """Write and remove a small object under the prefix: the bucket exists and the credentials may write."""
    import obstore

    store = _store(dest, probe=True)
    key = f"{dest.prefix}.colbert-k8s-probe-{uuid.uuid4().hex[:12]}"
    try:
        obstore.put(store, key, b"colbert-k8s export probe\n")
        obstore.delete(store, key)
    except Exception as e:
        fix = hint or "check that the bucket exists and that the credentials may write to it"
        what = f"a probe object cannot be written ({reason_of(e)})"
        raise ExportError(f"export.destination {dest}: {what}; {fix}") from None


def _upload_store(dest: Destination, plan: dict[str, Path], manifest: dict, journal_path: Path, done) -> int:
    """The marker ``colbert-k8s-export.partial`` and no manifest, then the files, then the files an earlier
    export left that this one does not hold removed, then the manifest and the marker gone; returns the
    bytes sent. Files the journal proves are there are skipped. ``done()`` is called after each file."""
    import obstore
    from tqdm import tqdm

    store = _store(dest)
    mkey, partial = dest.prefix + MANIFEST, dest.prefix + PARTIAL
    body = json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n"
    old = _get(store, mkey, dest)
    if old == body and _get(store, partial, dest) is None:
        log.info("export: %s already holds this export (its manifest matches); nothing to send", dest)
        for _ in plan:
            done()
        return 0
    saved = _read_journal(journal_path, str(dest))
    journal, stale = saved.get("files", {}), set(saved.get("stale", []))
    if old is not None:  # the files it lists that this export has not are removed before the new manifest
        stale |= set(files_of(old)) - set(plan)
    _write_journal(journal_path, dest, journal, stale)
    _call(dest, f"writing {PARTIAL}", lambda: obstore.put(store, partial, b"an export is being written\n"))
    _call(dest, f"removing the old {MANIFEST}", lambda: obstore.delete(store, mkey))  # no reader trusts it now
    sent = 0
    total = sum(manifest["files"][n]["size"] for n in plan)
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"export {dest}", mininterval=2) as bar:
        for name, path in plan.items():
            want = manifest["files"][name]
            if _already_there(store, dest.prefix + name, journal.get(name), want):
                bar.update(want["size"])
            else:
                put = lambda p=path, n=name: obstore.put(store, dest.prefix + n, _chunks(p, bar), chunk_size=_CHUNK)
                result = _call(dest, f"uploading {name}", put)
                sent += want["size"]
                journal[name] = {"sha256": want["sha256"], "size": want["size"], "e_tag": result.get("e_tag")}
                _write_journal(journal_path, dest, journal, stale)
            done()
    for name in sorted(stale - set(plan)):
        _call(dest, f"removing {name} (an earlier export's)", lambda n=name: obstore.delete(store, dest.prefix + n))
    _write_journal(journal_path, dest, journal, set())
    _call(dest, f"writing {MANIFEST}", lambda: obstore.put(store, mkey, body))
    _call(dest, f"removing {PARTIAL}", lambda: obstore.delete(store, partial))
    return sent


def _call(dest: Destination, what: str, fn):
    """One store operation; a failure after the store's retries is :class:`ExportFailed`'s one line."""
    try:
        return fn()
    except FileNotFoundError:
        return None  # a delete of what is already gone
    except Exception as e:
        raise ExportFailed(f"export to {dest}: {what} failed ({reason_of(e)})") from None


def _get(store, key: str, dest: Destination) -> bytes | None:
    import obstore

    found = _call(dest, f"reading {key}", lambda: obstore.get(store, key))
    return None if found is None else bytes(found.bytes())


def _write_journal(path: Path, dest: Destination, files: dict, stale: set[str]) -> None:
    write_text(path, json.dumps({"destination": str(dest), "files": files, "stale": sorted(stale)}, indent=1))


def _chunks(path: Path, bar) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            bar.update(len(block))
            yield block


def _already_there(store, key: str, done: dict | None, want: dict) -> bool:
    """Uploaded by an earlier start with these bytes, and the object is still the one it wrote (same ETag)."""
    import obstore

    if not done or done.get("sha256") != want["sha256"] or not done.get("e_tag"):
        return False
    try:
        meta = obstore.head(store, key)
    except Exception:
        return False
    return meta["size"] == want["size"] and meta.get("e_tag") == done["e_tag"]


def _read_journal(path: Path, dest: str) -> dict:
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) and saved.get("destination") == dest else {}
