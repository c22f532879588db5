"""Remote data and models, staged into the pod before training: the trainer's first phase.

``data.train.path``, ``data.eval_beir`` and ``model.name_or_path`` may name

* a local path (used as it is),
* an object store URL: ``s3://bucket/key`` (and ``gs://``, ``az://``), a single object, or every object
  under a prefix when it ends in ``/``,
* an ``http://`` or ``https://`` URL of one file,
* a Hugging Face Hub name (``hf://datasets/ORG/NAME`` for data, ``hf://ORG/NAME`` or ``ORG/NAME`` for a
  model), loaded by the hub's own client into its cache (offline, that is one line).

A URL is fetched once into ``data.cache_dir/sources/<hash of the URL>/``: each object is written to a
``.part`` file (continued with a range request after a dropped connection), its size checked against
the server's (and its MD5 against an S3 single-part ETag), then renamed; a ``.complete`` manifest is
written last. A restarted pod finds the manifest and does not download again; a half-written file is
never used. One process per node downloads (a file lock); the others wait and reuse it. A prefix that
holds a colbert-k8s export (``trainer/storage/export.py``) is read by its manifest: exactly the files it lists,
each checked against its sha256; one an export is still being written to is refused.

Credentials come only from the environment (``--secret-env``): ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ENDPOINT_URL`` and the like,
read by the object-store client; a URL with ``user:password@`` is refused, and no URL is logged with
credentials.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from filelock import FileLock

from trainer.atomic import sha256_of, write_text
from trainer.config.base import OBJECT_SCHEMES, hub_repo
from trainer.config.schema import ConfigError, TrainConfig
from trainer.redirects import Redirected
from trainer.storage.stores import bucket_store, reason

__all__ = ["SourceError", "check_present", "is_remote", "stage", "stage_config"]

log = logging.getLogger(__name__)
_CHUNK = 8 << 20
_RETRIES = 5


class SourceError(ConfigError):
    """A source that cannot be staged; one line naming the URL (without credentials) and the fix."""


def is_remote(value: str) -> bool:
    return urlsplit(value).scheme in OBJECT_SCHEMES


def _shown(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"


@dataclass(frozen=True)
class _Object:
    path: str  # the object's key in its store
    size: int
    etag: str | None


def _store(url: str):
    """An obstore store for the URL's bucket or host, configured from the environment, and the key in it."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        raise SourceError(
            f"{_shown(url)}: credentials in a URL are refused; pass them as environment variables "
            "(--secret-env AWS_ACCESS_KEY_ID=SECRET/KEY ...)"
        )
    try:
        return _open_store(parts)
    except Redirected as e:  # a custom endpoint that redirects elsewhere (trainer/redirects.py)
        raise SourceError(f"{_shown(url)}: {e}") from None
    except Exception as e:  # obstore's builders: a missing account (az://), a bad endpoint, ...
        raise SourceError(
            f"{_shown(url)}: cannot be opened ({reason(e)}); check the URL and the store's environment "
            "(AWS_REGION, AWS_ENDPOINT_URL, AZURE_STORAGE_ACCOUNT_NAME, ...)"
        ) from None


def _open_store(parts):
    from obstore.store import HTTPStore

    if parts.scheme in ("http", "https"):
        base = f"{parts.scheme}://{parts.netloc}"
        return HTTPStore.from_url(base, client_options={"allow_http": True, "timeout": "120s"}), parts.path.lstrip("/")
    return bucket_store(parts.scheme, parts.netloc, {"timeout": "120s"}), parts.path.lstrip("/")


def _list(store, key: str, url: str) -> list[_Object]:
    """The object ``key``, or every object under the prefix ``key`` (when it ends in ``/``)."""
    import obstore

    try:
        if key.endswith("/") or key == "":
            found = [
                _Object(o["path"], o["size"], o.get("e_tag"))
                for batch in obstore.list(store, prefix=key.rstrip("/") or None)
                for o in batch
            ]
            if not found:
                raise SourceError(f"{_shown(url)}: no objects under this prefix; check the path")
            return found
        meta = obstore.head(store, key)
        return [_Object(meta["path"], meta["size"], meta.get("e_tag"))]
    except SourceError:
        raise
    except FileNotFoundError:
        raise SourceError(f"{_shown(url)}: no such object; check the path (and that the bucket is right)") from None
    except Exception as e:
        raise SourceError(
            f"{_shown(url)}: cannot be reached ({reason(e)}); check the URL, network and credentials"
        ) from None


def _download(store, obj: _Object, dest: Path, url: str, bar) -> None:
    """Fetch ``obj`` into ``dest`` through ``dest.part``, continuing after dropped connections."""
    import obstore

    part = dest.with_name(dest.name + ".part")
    part.parent.mkdir(parents=True, exist_ok=True)
    attempts = 0
    while True:
        done = part.stat().st_size if part.exists() else 0
        if done > obj.size:
            part.unlink()
            done = 0
        try:
            with open(part, "ab") as f:
                while done < obj.size:
                    data = obstore.get_range(store, obj.path, start=done, end=min(obj.size, done + _CHUNK))
                    f.write(bytes(data))
                    done += len(data)
                    bar.update(len(data))
                f.flush()
                os.fsync(f.fileno())
            break
        except Exception as e:
            attempts += 1
            if attempts > _RETRIES:
                raise SourceError(
                    f"{_shown(url)}: download of {obj.path} failed {attempts} times ({reason(e)}); "
                    f"{done} of {obj.size} bytes are kept in the cache and the next start continues"
                ) from None
            log.warning("download of %s interrupted at %d/%d bytes (%s); continuing", obj.path, done, obj.size, e)
            time.sleep(min(30, 2**attempts))
    _verify(part, obj, url)
    os.replace(part, dest)


def _verify(path: Path, obj: _Object, url: str) -> None:
    size = path.stat().st_size
    if size != obj.size:
        path.unlink()
        raise SourceError(f"{_shown(url)}: {obj.path} arrived with {size} bytes, the server said {obj.size}; retry")
    etag = (obj.etag or "").strip('"')
    if re.fullmatch(r"[0-9a-f]{32}", etag):  # S3 single-part upload: the ETag is the MD5
        md5 = hashlib.md5(usedforsecurity=False)
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(_CHUNK), b""):
                md5.update(block)
        if md5.hexdigest() != etag:
            path.unlink()
            raise SourceError(f"{_shown(url)}: {obj.path} does not match its checksum (MD5 {etag}); retry")


def stage(url: str, cache_dir: str | Path) -> Path:
    """The local copy of ``url`` (a file, or a directory for a prefix), downloading it the first time."""
    from tqdm import tqdm

    key = hashlib.sha256(_shown(url).encode()).hexdigest()[:20]
    root = Path(cache_dir) / "sources" / key
    complete = root / ".complete"
    root.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(root.with_suffix(".lock")):
        store, prefix = _store(url)
        is_dir = prefix.endswith("/") or prefix == ""
        target = root / "files" if is_dir else root / Path(prefix).name
        if complete.is_file() and target.exists():
            log.info("using the cached copy of %s in %s", _shown(url), root)
            return target
        objects = _list(store, prefix, url)
        manifest = _export_manifest(store, prefix, objects, url) if is_dir else None
        if manifest is not None:  # a colbert-k8s export: exactly the files it lists, checked against it
            objects = [o for o in objects if o.path[len(prefix.rstrip("/")) :].lstrip("/") in manifest]
        total = sum(o.size for o in objects)
        with tqdm(total=total, unit="B", unit_scale=True, desc=f"fetch {_shown(url)}", mininterval=2) as bar:
            for obj in objects:
                rel = obj.path[len(prefix.rstrip("/")) :].lstrip("/") if is_dir else Path(obj.path).name
                dest = (root / "files" / rel) if is_dir else target
                if dest.is_file() and dest.stat().st_size == obj.size:
                    bar.update(obj.size)  # fetched by an earlier, interrupted start
                    continue
                _download(store, obj, dest, url, bar)
        if manifest is not None:
            _check_export(root / "files", manifest, url)
        files = {o.path: o.size for o in objects}
        write_text(root / ".complete", json.dumps({"url": _shown(url), "files": files}))
        log.info("staged %s (%d object(s), %.1f MiB) in %s", _shown(url), len(objects), total / 2**20, root)
    return target


def _export_manifest(store, prefix: str, objects: list[_Object], url: str) -> dict | None:
    """The file list of a colbert-k8s export under ``prefix`` (trainer/storage/export.py), None if it is no export;
    a prefix an export is still being written to (or that one left half-written) is refused."""
    import obstore

    from trainer.storage.export import MANIFEST, PARTIAL

    names = {o.path[len(prefix.rstrip("/")) :].lstrip("/") for o in objects}
    if PARTIAL in names:
        raise SourceError(
            f"{_shown(url)}: an export is being written there, or one was interrupted ({PARTIAL}); "
            "wait for it, or restart the job that exports there"
        )
    if MANIFEST not in names:
        return None
    try:
        key = f"{prefix.rstrip('/')}/{MANIFEST}".lstrip("/")
        listed = json.loads(bytes(obstore.get(store, key).bytes()))["files"]
    except Exception as e:
        raise SourceError(f"{_shown(url)}: its {MANIFEST} cannot be read ({reason(e)})") from None
    if missing := sorted(set(listed) - names):
        raise SourceError(f"{_shown(url)}: {missing[0]} is listed in its {MANIFEST} but not there; export it again")
    return listed


def _check_export(files: Path, listed: dict, url: str) -> None:
    """Every file of an export has the size and sha256 its manifest says: a mixed or damaged export is refused."""
    for name, want in listed.items():
        path = files / name
        if path.stat().st_size != want["size"] or sha256_of(path) != want["sha256"]:
            path.unlink()
            raise SourceError(
                f"{_shown(url)}: {name} does not match the export's manifest (size or sha256); export it again"
            )


def _as_prefix(url: str) -> str:
    """A directory's URL (BEIR split, model): everything under it."""
    return url if url.endswith("/") else url + "/"


def _model_path(name: str, cache) -> str:
    """A model's name as the loader takes it: a remote prefix staged to a local copy, ``hf://`` dropped
    (the hub name is loaded as is), anything else unchanged."""
    if is_remote(name):
        return str(stage(_as_prefix(name), cache))
    repo = hub_repo(name)
    return repo.repo_id if repo is not None and repo.kind == "model" else name


def stage_config(cfg: TrainConfig) -> TrainConfig:
    """The config with every remote source replaced by its staged local copy (one pass per pod)."""
    cache = cfg.data.cache_dir
    updates: dict = {}
    if is_remote(cfg.data.train.path):
        staged = stage(cfg.data.train.path, cache)
        updates["train"] = cfg.data.train.model_copy(update={"path": str(staged)})
    if cfg.data.eval_beir and is_remote(cfg.data.eval_beir):
        updates["eval_beir"] = str(stage(_as_prefix(cfg.data.eval_beir), cache))
    data = cfg.data.model_copy(update=updates) if updates else cfg.data
    model = cfg.model.model_copy(update={"name_or_path": _model_path(cfg.model.name_or_path, cache)})
    mine = cfg.mine
    if mine and mine.corpus and is_remote(mine.corpus):  # a .jsonl object, or a BEIR prefix
        url = mine.corpus if mine.corpus.endswith(".jsonl") else _as_prefix(mine.corpus)
        mine = mine.model_copy(update={"corpus": str(stage(url, cache))})
    if mine and mine.model:
        mine = mine.model_copy(update={"model": _model_path(mine.model, cache)})
    if mine and mine.teacher and is_remote(mine.teacher.name_or_path):
        staged = stage(_as_prefix(mine.teacher.name_or_path), cache)
        mine = mine.model_copy(update={"teacher": mine.teacher.model_copy(update={"name_or_path": str(staged)})})
    return cfg.model_copy(update={"data": data, "model": model, "mine": mine})


def _looks_local(value: str) -> bool:
    """A model value that can only be a path: absolute, ./ or ../, or more than a Hub name's ORG/NAME."""
    return "://" not in value and (value.startswith(("/", "./", "../", "~")) or value.strip("/").count("/") >= 2)


def check_present(cfg: TrainConfig) -> None:
    """Every local file and directory the config names, found now, once per pod, before any mining,
    training or model load: a missing ``data.eval_beir`` was met only after mining had run. Remote
    sources are staged by then (:func:`stage_config`); a Hub name is the hub client's to find. Not
    ``index.corpus``: only rank 0's pod builds the index, and with per-pod storage only it holds that corpus."""
    wanted: list[tuple[str, Path]] = []
    if beir := cfg.data.eval_beir:
        wanted += [("data.eval_beir", Path(beir) / name) for name in ("corpus.jsonl", "queries.jsonl")]
        wanted.append(("data.eval_split", Path(beir) / "qrels" / f"{cfg.data.eval_split}.tsv"))
    mine = cfg.mine
    if mine and mine.corpus and "://" not in mine.corpus:
        corpus = Path(mine.corpus)
        wanted.append(("mine.corpus", corpus / "corpus.jsonl" if corpus.is_dir() else corpus))
    models = [("model.name_or_path", cfg.model.name_or_path)]
    if mine:
        models.append(("mine.model", mine.model))
        models.append(("mine.teacher.name_or_path", mine.teacher.name_or_path if mine.teacher else None))
    wanted += [(key, Path(value)) for key, value in models if value and _looks_local(value)]
    for key, path in wanted:
        if not path.exists():
            raise SourceError(
                f"{key}: {path} not found (relative paths resolve under the job's volume, here {Path.cwd()}); "
                "put it there, or name an s3://, gs://, az://, https:// or hf:// source"
            )
