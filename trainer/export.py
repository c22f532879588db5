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
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

from trainer.atomic import sha256_of, write_text
from trainer.config import ConfigError
from trainer.config_base import Destination, parse_destination
from trainer.errors import EXIT_EXPORT
from trainer.stores import bucket_store, reason

__all__ = [
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

MANIFEST = "colbert-k8s-export.json"  # written last: a destination without it holds no export
PARTIAL = "colbert-k8s-export.partial"  # there while an export is written: a reader refuses the prefix
_JOURNAL = ".export-journal.json"
_CHUNK = 8 << 20
# Credentials the destination's client reads from the environment; any one set is enough. Where none is
# set, the client falls back to the node's identity (instance metadata, GKE/AKS workload identity).
CREDENTIALS = {
    "s3": (
        ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
        ("AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"),  # EKS IRSA
        ("AWS_CONTAINER_CREDENTIALS_FULL_URI",),  # EKS Pod Identity
    ),
    # GOOGLE_SERVICE_ACCOUNT_KEY holds the key's JSON (a Secret's value); the other two name a mounted file
    "gs": (("GOOGLE_SERVICE_ACCOUNT_KEY",), ("GOOGLE_APPLICATION_CREDENTIALS",), ("GOOGLE_SERVICE_ACCOUNT",)),
    "az": (
        ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY"),
        ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_SAS_KEY"),
        ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET"),
        ("AZURE_FEDERATED_TOKEN_FILE",),  # AKS workload identity
    ),
    "hf": (("HF_TOKEN",),),
}


class ExportError(ConfigError):
    """A destination that cannot be exported to: found at start, one line naming the fix, exit 2."""


class ExportFailed(Exception):
    """The upload failed after the store's retries: one line, exit :data:`EXIT_EXPORT`; a restart retries."""


def credential_hint(dest: Destination, env: set[str] | dict) -> tuple[str, str] | None:
    """(what is missing, the flags that pass it) when the environment holds none of the destination's
    credential sets; else None.

    >>> credential_hint(parse_destination("hf://org/m"), {})
    ('needs HF_TOKEN (a token with write access)', '--secret-env HF_TOKEN=SECRET/KEY')
    >>> credential_hint(parse_destination("s3://b/p"), {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}) is None
    True
    """
    sets = CREDENTIALS[dest.scheme]
    if any(all(var in env for var in one) for one in sets):
        return None
    if dest.hub:
        return "needs HF_TOKEN (a token with write access)", "--secret-env HF_TOKEN=SECRET/KEY"
    return "needs credentials", " and ".join(f"--secret-env {v}=SECRET/KEY" for v in sets[0])


# ---- what is exported -----------------------------------------------------------------------------


def planned_files(cfg) -> dict[str, Path]:
    """{name at the destination: local file}: the final model's files at the root, metrics.json, and
    what ``export.include`` adds under its own folder."""
    out = Path(cfg.output_dir)
    plan = {p.relative_to(out / "final-model").as_posix(): p for p in _files(out / "final-model")}
    plan["metrics.json"] = out / "metrics.json"
    for item in cfg.export.include:
        if item == "checkpoint":
            from trainer.checkpoint import list_checkpoints  # torch: only when a checkpoint is asked for

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


# ---- object stores --------------------------------------------------------------------------------


def _store(dest: Destination, probe: bool = False):
    """An obstore store for the bucket, configured from the environment (as trainer/sources.py reads). The
    probe's is quick to give up (a server that never answers must not hold the start for minutes); the
    upload's retries transient errors with the store's own backoff."""
    options = {"timeout": "30s" if probe else "300s", "connect_timeout": "10s"}
    retry = {"max_retries": 1, "retry_timeout": timedelta(seconds=60)} if probe else {
        "max_retries": 10, "retry_timeout": timedelta(minutes=10)}  # fmt: skip
    try:
        return bucket_store(dest.scheme, dest.bucket, options, retry_config=retry)
    except Exception as e:  # a builder's complaint: no account (az://), a bad endpoint, ...
        raise ExportError(f"export.destination {dest}: cannot be opened ({_reason(e)})") from None


def _reason(e: BaseException) -> str:
    """What a store's error means, in words, where its text says; else :func:`trainer.stores.reason`."""
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
        what = f"a probe object cannot be written ({_reason(e)})"
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
        stale |= set(_files_of(old)) - set(plan)
    _write_journal(journal_path, dest, journal, stale)
    _call(dest, f"writing {PARTIAL}", lambda: obstore.put(store, partial, b"an export is being written\n"))
    _call(dest, f"removing the old {MANIFEST}", lambda: obstore.delete(store, mkey))  # no reader trusts it now
    sent = 0
    with tqdm(total=sum(manifest["files"][n]["size"] for n in plan), unit="B", unit_scale=True,
              desc=f"export {dest}", mininterval=2) as bar:  # fmt: skip
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
        raise ExportFailed(f"export to {dest}: {what} failed ({_reason(e)})") from None


def _get(store, key: str, dest: Destination) -> bytes | None:
    import obstore

    found = _call(dest, f"reading {key}", lambda: obstore.get(store, key))
    return None if found is None else bytes(found.bytes())


def _files_of(manifest: bytes) -> list[str]:
    try:
        return list(json.loads(manifest).get("files", {}))
    except (ValueError, AttributeError):
        return []


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


# ---- the Hub --------------------------------------------------------------------------------------


def _hub(cfg):
    from huggingface_hub import HfApi

    # read here, not at the library's import: a test (or a caller) may set them after it
    return HfApi(endpoint=os.environ.get("HF_ENDPOINT"), token=os.environ.get("HF_TOKEN"))


def _probe_hub(cfg, dest: Destination) -> None:
    """The token may write to the repository: whoami (a read token is refused), the repository created when
    missing, then a real write, a probe branch made and removed (a write token of another namespace passes
    whoami and ``create_repo(exist_ok=True)`` alike). A 429, a 5xx or no answer is retryable, not a refusal."""
    from huggingface_hub.errors import HfHubHTTPError

    api = _hub(cfg)
    probe = f"colbert-k8s-probe-{uuid.uuid4().hex[:12]}"
    step = "whoami"
    try:
        who = api.whoami(cache=True)
        role = (who.get("auth", {}).get("accessToken") or {}).get("role")
        if role == "read":
            raise ExportError(f"export.destination {dest}: HF_TOKEN is a read token; export needs write access")
        step = "the repository"
        api.create_repo(dest.bucket, private=cfg.export.private, exist_ok=True, repo_type="model")
        if cfg.export.private and not api.repo_info(dest.bucket, repo_type="model").private:
            raise ExportError(f"export.destination {dest} exists and is public, but export.private is set; make "
                              "it private on the Hub, or remove export.private")  # fmt: skip
        if cfg.export.revision:
            api.create_branch(dest.bucket, branch=cfg.export.revision, exist_ok=True)
        step = "a probe branch"
        api.create_branch(dest.bucket, branch=probe, revision=cfg.export.revision)
        api.delete_branch(dest.bucket, branch=probe)
        step = "its files"
        _hub_stale(dest, *_hub_previous(api, dest, cfg.export.revision), {}, cfg.export.replace)
    except HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None) or 0
        if status == 429 or status >= 500:
            raise ExportFailed(f"export.destination {dest}: the Hub answered {_hub_reason(e)} at {step}; "
                               "retrying at the next start") from None  # fmt: skip
        if step == "whoami":
            raise ExportError(f"export.destination {dest}: the Hub refused HF_TOKEN ({_hub_reason(e)}); "
                              "pass a valid token with --secret-env HF_TOKEN=SECRET/KEY") from None  # fmt: skip
        raise ExportError(f"export.destination {dest}: the repository cannot be created or written ({step}: "
                          f"{_hub_reason(e)}); check the name and the token's rights on {dest.bucket.split('/')[0]}"
                          ) from None  # fmt: skip
    except (ExportError, ExportFailed):
        raise
    except Exception as e:  # httpx's connection errors and timeouts: no answer, so perhaps a passing fault
        raise ExportFailed(f"export.destination {dest}: the Hub cannot be reached ({_reason(e)}); check "
                           "HF_ENDPOINT and the network") from None  # fmt: skip


def _hub_reason(e) -> str:
    status = getattr(getattr(e, "response", None), "status_code", None)
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return f"HTTP {status}: {first[:160]}" if status else first[:200]


def _upload_hub(cfg, dest: Destination, plan: dict[str, Path], manifest: dict) -> None:
    """One commit: the files, the manifest, and the removal of the files the previous export listed in its
    manifest that this one has not (:func:`_hub_stale`), so what an export wrote is exactly this export."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    body = json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n"
    api = _hub(cfg)
    try:
        stale = _hub_stale(dest, *_hub_previous(api, dest, cfg.export.revision), plan, cfg.export.replace)
        ops = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(path)) for name, path in plan.items()]
        ops.append(CommitOperationAdd(path_in_repo=MANIFEST, path_or_fileobj=body))
        ops += [CommitOperationDelete(path_in_repo=name) for name in stale]
        info = api.create_commit(
            dest.bucket, ops, commit_message="colbert-k8s export", revision=cfg.export.revision, repo_type="model"
        )
    except ExportError as e:  # files appeared since the start's check; the restart's check refuses the job
        raise ExportFailed(str(e)) from None
    except Exception as e:  # HTTP errors, httpx's connection errors, a card the Hub refuses: one line, retryable
        raise ExportFailed(f"export to {dest}: the commit failed ({_hub_reason(e)})") from None
    log.info("export: commit %s (files the Hub already held unchanged were not sent)", info.oid)


def _hub_previous(api, dest: Destination, revision: str | None) -> tuple[list[str], bytes | None]:
    """The files the repository holds at ``revision``, and its previous export's manifest (None: none)."""
    import tempfile

    held = api.list_repo_files(dest.bucket, revision=revision, repo_type="model")
    if MANIFEST not in held:
        return held, None
    with tempfile.TemporaryDirectory() as cache:  # not the job's HF cache: read once, then gone
        return held, Path(api.hf_hub_download(dest.bucket, MANIFEST, revision=revision, cache_dir=cache)).read_bytes()


def _hub_stale(dest: Destination, held: list[str], old: bytes | None, plan, replace: bool) -> list[str]:
    """What the export removes: the files the previous export's manifest lists, the repository holds and
    this export has not. A repository holding files but no manifest was not written by an export: refused
    in one line, unless ``export.replace`` (then every file but this export's goes)."""
    keep = {*plan, MANIFEST, ".gitattributes"}  # .gitattributes: the Hub's own, made with the repository
    if replace:
        return sorted(set(held) - keep)
    if old is None:
        if foreign := sorted(set(held) - {".gitattributes"}):
            raise ExportError(
                f"export.destination {dest} holds {len(foreign)} file(s) that no colbert-k8s export wrote "
                f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}) and no {MANIFEST}; export to a "
                "new or empty repository, or set export.replace: true to replace its contents"
            )
        return []
    return sorted((set(_files_of(old)) & set(held)) - keep)


# ---- the entry points -----------------------------------------------------------------------------


def preflight(cfg) -> None:
    """At start: the destination's credentials are in the environment and it takes a write."""
    if cfg.export is None:
        return
    dest = parse_destination(cfg.export.destination)
    missing = credential_hint(dest, os.environ)
    hint = f"{dest.scheme}:// {missing[0]} in the environment: {missing[1]}" if missing else None
    if dest.hub:
        if hint:
            raise ExportError(f"export.destination {dest}: {hint}")
        _probe_hub(cfg, dest)
    else:  # no credentials in the environment may still mean workload identity: the probe decides
        _probe_store(dest, hint and hint + " (or workload identity)")
    log.info("export: %s takes writes; the model goes there after training", dest)


def run(cfg, progress=None) -> dict:
    """Rank 0, once the final model, metrics.json and the index are whole: upload them, manifest last.
    ``progress``: the job's (trainer/progress.py), whose last phase the export is."""
    dest = parse_destination(cfg.export.destination)
    started = time.perf_counter()
    plan = planned_files(cfg)
    manifest = manifest_for(plan)
    done = (lambda: progress.advance("export")) if progress is not None else (lambda: None)
    if progress is not None:
        progress.begin("export", items=1 if dest.hub else len(plan))
    if dest.hub:
        sent = _upload_hub(cfg, dest, plan, manifest)
        done()
    else:
        sent = _upload_store(dest, plan, manifest, Path(cfg.output_dir) / _JOURNAL, done)
    result = {"destination": str(dest), "files": len(plan), "bytes": sum(f["size"] for f in manifest["files"].values()),
              "bytes_sent": sent, "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip
    write_text(Path(cfg.output_dir) / "export.json", json.dumps(result, indent=2) + "\n")
    log.info("export done: %s", json.dumps(result))
    return result
