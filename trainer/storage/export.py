"""Export: the trained model leaves the cluster, for an object store or a Hugging Face Hub repository.

``export.destination`` is ``s3://BUCKET/PREFIX/`` (``gs://``, ``az://`` alike) or ``hf://ORG/NAME`` (a Hub
model repository; ``export.revision`` a branch, ``export.private`` when it is created). The destination's
root is the model directory itself (config, weights, the card ``README.md``), as on the Hub, with
``metrics.json`` and ``colbert-k8s-export.json`` beside it, and ``best-model/``, ``index/`` and
``checkpoint/`` where ``export.include`` asks for them. So ``model.name_or_path: s3://BUCKET/PREFIX/`` reads
an export back, and ``pylate.models.ColBERT("ORG/NAME")`` loads one from the Hub.

* **Checked at start** (:func:`preflight`, in every pod before staging): the destination parses, the
  environment holds its credentials, and it is writable: a probe object is written and removed, or the
  Hub's whoami says the token may write and the repository is there (created when missing). A bad
  destination is one line and exit 2 before the model is even loaded.
* **Atomic** (:func:`run`, rank 0, after the final model, ``metrics.json`` and the index are whole). On
  an object store, an old ``colbert-k8s-export.json`` is removed first, the files are uploaded, and the
  manifest (the size and sha256 of every file) is written last: a reader trusts a prefix with a manifest
  only, and checks the files against it. On the Hub, the files go in one commit (huggingface_hub's
  ``create_commit``), manifest included.
* **Removes only what an export wrote**: the files the previous manifest lists and this export has not.
  A Hub repository holding files but no manifest is refused at start unless ``export.replace: true``.
* **Resumable.** A journal in ``output_dir`` records each uploaded file's sha256 and the ETag the store
  returned; after a kill, a file whose object still has that ETag is skipped. The Hub skips unchanged
  files itself (its pre-upload answer carries each file's id) and stores an LFS object once.
* **Retried** through the store's own retry settings (obstore's backoff; huggingface_hub's). A failure
  after them is one line and exit :data:`EXIT_EXPORT` (retryable): the model is already safe in
  ``output_dir``, and a restart does the export again without training again.
* **Credentials** come only from the environment (``--secret-env``, workload identity); no URL with
  credentials is accepted, and none is logged.

Each scheme's uploader is its own module (``trainer/destinations/``: ``store.py`` for s3/gs/az, ``hub.py``
for hf), found by the registry (:data:`trainer.destinations.DESTINATIONS`); this module plans the files, writes
the manifest's content and drives the uploader.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from trainer.atomic import sha256_of, write_text
from trainer.config.base import parse_destination
from trainer.destinations import CREDENTIALS, credential_hint, uploader
from trainer.destinations.base import MANIFEST, PARTIAL, ExportError, ExportFailed
from trainer.errors import EXIT_EXPORT

__all__ = [
    "CREDENTIALS",
    "EXIT_EXPORT",
    "MANIFEST",
    "PARTIAL",
    "ExportError",
    "ExportFailed",
    "credential_hint",
    "preflight",
    "run",
]

log = logging.getLogger("trainer")


# ---- what is exported -----------------------------------------------------------------------------


def planned_files(cfg) -> dict[str, Path]:
    """{name at the destination: local file}: the final model's files at the root, metrics.json, and
    what ``export.include`` adds under its own folder."""
    out = Path(cfg.output_dir)
    plan = {p.relative_to(out / "final-model").as_posix(): p for p in _files(out / "final-model")}
    plan["metrics.json"] = out / "metrics.json"
    for item in cfg.export.include:
        if item == "checkpoint":
            from trainer.run.checkpoint import list_checkpoints  # torch: only when a checkpoint is asked for

            found = list_checkpoints(out / "checkpoints")
            if not found:
                log.info("export: no checkpoint to include (the job kept none at its end)")
                continue
            where, folder = found[-1][1], "checkpoint"
        else:
            where, folder = out / item, item
        plan.update({f"{folder}/{p.relative_to(where).as_posix()}": p for p in _files(where)})
    return plan


def _files(root: Path) -> list[Path]:
    if not root.is_dir():
        raise ExportFailed(f"{root} is missing: the phase that writes it is not whole; restart the job to redo it")
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".tmp"))


def manifest_for(plan: dict[str, Path]) -> dict:
    return {
        "format": 1,
        "files": {name: {"size": p.stat().st_size, "sha256": sha256_of(p)} for name, p in sorted(plan.items())},
    }


# ---- the entry points -----------------------------------------------------------------------------


def preflight(cfg) -> None:
    """At start: the destination's credentials are in the environment and it takes a write."""
    if cfg.export is None:
        return
    dest = parse_destination(cfg.export.destination)
    missing = credential_hint(dest, os.environ)
    hint = f"{dest.scheme}:// {missing[0]} in the environment: {missing[1]}" if missing else None
    uploader(dest).preflight(cfg, dest, hint)
    log.info("export: %s takes writes; the model goes there after training", dest)


def run(cfg, progress=None) -> dict:
    """Rank 0, once the final model, metrics.json and the index are whole: upload them, manifest last.
    ``progress``: the job's (trainer/reporting/progress.py), whose last phase the export is."""
    dest = parse_destination(cfg.export.destination)
    started = time.perf_counter()
    plan = planned_files(cfg)
    manifest = manifest_for(plan)
    destination = uploader(dest)
    done = (lambda: progress.advance("export")) if progress is not None else (lambda: None)
    if progress is not None:
        progress.begin("export", items=destination.steps(plan))
    sent = destination.upload(cfg, dest, plan, manifest, done)
    result = {
        "destination": str(dest),
        "files": len(plan),
        "bytes": sum(f["size"] for f in manifest["files"].values()),
        "bytes_sent": sent,
        "seconds": round(time.perf_counter() - started, 1),
    }
    write_text(Path(cfg.output_dir) / "export.json", json.dumps(result, indent=2) + "\n")
    log.info("export done: %s", json.dumps(result))
    return result
