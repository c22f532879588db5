"""Export to a Hugging Face Hub model repository (``hf://ORG/NAME``): a write probe at start (whoami, the
repository created when missing, a probe branch), then one commit with the files, the manifest and the removal
of what the previous export wrote and this one has not (``trainer/storage/export.py`` says why). ``HF_TOKEN`` goes
to ``HF_ENDPOINT``'s origin only (``trainer/redirects.py``: httpx strips it on a redirect elsewhere, and
:func:`~trainer.redirects.guard_hub` where huggingface_hub would not); such a redirect is one line."""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.config.base import Destination
from trainer.destinations.base import MANIFEST, ExportError, ExportFailed, files_of, reason_of
from trainer.redirects import guard_hub, hub_redirect

__all__ = ["HubRepository"]

log = logging.getLogger("trainer")


class HubRepository:
    """The uploader of a Hub model repository."""

    def preflight(self, cfg: Any, dest: Destination, hint: str | None) -> None:
        if hint:  # the Hub has no workload identity: no token is no export
            raise ExportError(f"export.destination {dest}: {hint}")
        _probe_hub(cfg, dest)

    def upload(
        self, cfg: Any, dest: Destination, plan: dict[str, Path], manifest: dict, done: Callable[[], None]
    ) -> int | None:
        _upload_hub(cfg, dest, plan, manifest)
        done()
        return None  # the Hub skips unchanged files itself: what it sent is not counted here

    def steps(self, plan: dict[str, Path]) -> int:
        return 1


_REDIRECT_FIX = "set HF_ENDPOINT to the Hub's own address (not a proxy or a login page)"


def _hub(cfg):
    from huggingface_hub import HfApi

    guard_hub()  # HF_TOKEN goes to the Hub's origin only, never through a redirect
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
            raise ExportError(
                f"export.destination {dest} exists and is public, but export.private is set; make "
                "it private on the Hub, or remove export.private"
            )
        if cfg.export.revision:
            api.create_branch(dest.bucket, branch=cfg.export.revision, exist_ok=True)
        step = "a probe branch"
        api.create_branch(dest.bucket, branch=probe, revision=cfg.export.revision)
        api.delete_branch(dest.bucket, branch=probe)
        step = "its files"
        _hub_stale(dest, *_hub_previous(api, dest, cfg.export.revision), {}, cfg.export.replace)
    except HfHubHTTPError as e:
        if line := hub_redirect(e, _REDIRECT_FIX):
            raise ExportError(f"export.destination {dest}: {line}") from None
        status = getattr(getattr(e, "response", None), "status_code", None) or 0
        if status == 429 or status >= 500:
            raise ExportFailed(
                f"export.destination {dest}: the Hub answered {_hub_reason(e)} at {step}; retrying at the next start"
            ) from None
        if step == "whoami":
            raise ExportError(
                f"export.destination {dest}: the Hub refused HF_TOKEN ({_hub_reason(e)}); "
                "pass a valid token with --secret-env HF_TOKEN=SECRET/KEY"
            ) from None
        raise ExportError(
            f"export.destination {dest}: the repository cannot be created or written ({step}: "
            f"{_hub_reason(e)}); check the name and the token's rights on {dest.bucket.split('/')[0]}"
        ) from None
    except (ExportError, ExportFailed):
        raise
    except Exception as e:  # httpx's connection errors and timeouts: no answer, so perhaps a passing fault
        raise ExportFailed(
            f"export.destination {dest}: the Hub cannot be reached ({reason_of(e)}); check HF_ENDPOINT and the network"
        ) from None


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
        if line := hub_redirect(e, _REDIRECT_FIX):
            raise ExportError(f"export to {dest}: {line}") from None
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
    return sorted((set(files_of(old)) & set(held)) - keep)
