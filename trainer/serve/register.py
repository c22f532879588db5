"""Registration: a verified export becomes a version of a registered model in the Kubeflow Model Registry, once.

A job with ``register:`` (and ``export:``) registers on rank 0 right after its export (``trainer/rounds.py``);
``colbert-k8s register NAME|URI`` registers a finished job's export, or any export, from a workstation. The
version carries

* the export as its model artifact: ``uri`` (what an InferenceService's ``storageUri`` takes), ``storageKey``
  (``register.storage_key``: the storage Secret a KServe deployment fetches it with) and ``storagePath``;
* the measured figures: nDCG@10 before and after training and through the PLAID index, and the training
  summary the card shows (steps, global batch, world size, training data);
* the base model, the job's name and the sha256 of the export's manifest.

**Once.** After success ``output_dir/registered.json`` is written atomically; a restart that finds it for this
export (same destination, same manifest) registers nothing. Killed between the registry's answer and the
marker, the restart finds the version by name, with this export's manifest sha256 (``export_manifest_sha256``)
and URI, and adds nothing; a version of that name made for another export (another digest) or that points
elsewhere is refused in one line (set ``register.version``). A registry that
cannot be reached or fails is :class:`RegisterFailed` (retryable, as a failed export: the restart retries).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from trainer.config.schema import TrainConfig
from trainer.serve.registry import Registry, RegistryError, check_endpoint, metadata
from trainer.storage.export import ExportFailed

__all__ = [
    "MARKER",
    "Entry",
    "RegisterFailed",
    "after_export",
    "entry_for",
    "from_card",
    "preflight",
    "read_export",
    "register",
    "register_export",
]

log = logging.getLogger("trainer")
MARKER = "registered.json"  # in output_dir, written after the registry answered


class RegisterFailed(ExportFailed):
    """Registration failed (no registry, an error answer): one line; the restart registers again, once."""


@dataclass(frozen=True)
class Entry:
    """What one registration writes: the model, the version, its artifact and its properties."""

    model: str
    version: str
    uri: str
    manifest_sha256: str
    description: str | None = None
    labels: list[str] = field(default_factory=list)
    storage_key: str | None = None
    properties: dict = field(default_factory=dict)

    def version_body(self) -> dict:
        props = {k: metadata(v) for k, v in self.properties.items() if v is not None}
        props.update({label: metadata("") for label in self.labels})  # the registry UI's labels: empty strings
        body = {"name": self.version, "author": "colbert-k8s", "customProperties": props}
        return body | ({"description": self.description} if self.description else {})

    def artifact_body(self) -> dict:
        path = self.uri.split("://", 1)[-1].split("/", 1)[-1] if "://" in self.uri else self.uri
        body = {
            "artifactType": "model-artifact",
            "name": f"{self.model}-{self.version}",
            "uri": self.uri,
            "storagePath": path,
            "modelFormatName": "pylate-colbert",
            "modelFormatVersion": "1",
        }
        return body | ({"storageKey": self.storage_key} if self.storage_key else {})


def _figure(metrics: dict, phase: str) -> float | None:
    value = (metrics.get(phase) or {}).get("ndcg@10")
    return round(float(value), 6) if value is not None else None


def entry_for(rcfg, uri: str, manifest: bytes, metrics: dict, base_model: str, job: str) -> Entry:
    """The registration of the export at ``uri`` (its manifest's bytes, its metrics.json) as ``rcfg`` says."""
    digest = hashlib.sha256(manifest).hexdigest()
    properties = {
        "ndcg_at_10_before": _figure(metrics, "before"),
        "ndcg_at_10_after": _figure(metrics, "after"),
        "ndcg_at_10_index": _figure(metrics, "index"),
        "steps": metrics.get("steps"),
        "global_batch": metrics.get("global_batch"),
        "world_size": metrics.get("world_size"),
        "train_data": metrics.get("train_data"),
        "base_model": base_model,
        "job": job,
        "export_manifest_sha256": digest,
    }
    return Entry(
        model=rcfg.name,
        version=rcfg.version or f"{job}-{digest[:8]}",
        uri=uri,
        manifest_sha256=digest,
        description=rcfg.description,
        labels=list(rcfg.labels),
        storage_key=rcfg.storage_key,
        properties=properties,
    )


def register(registry: Registry, entry: Entry) -> dict:
    """The registered model (found or created), the version (found or created) and its artifact: ids, and
    ``created``: whether this call created the version."""
    model = registry.find_model(entry.model)
    if model is None:
        try:
            model = registry.create_model({"name": entry.model})
        except RegistryError as e:
            if e.status != 409:  # another writer created it meanwhile: find it again
                raise
            model = registry.find_model(entry.model)
            if model is None:
                raise RegistryError(f"{entry.model!r}: the registry said it exists (409) but cannot find it") from None
    version, created = registry.find_version(model["id"], entry.version), False
    if version is None:
        version, created = registry.create_version(model["id"], entry.version_body()), True
    elif (held_digest := _digest_of(version)) != entry.manifest_sha256:
        raise RegistryError(
            f"version {entry.version!r} of {entry.model!r} exists for another export (its manifest sha256 "
            f"{held_digest or 'none'}, this export's {entry.manifest_sha256}); set register.version (--version) "
            "to a new name"
        )
    held = [a for a in registry.artifacts(version["id"]) if a.get("artifactType", "model-artifact") == "model-artifact"]
    if ours := [a for a in held if a.get("uri") == entry.uri]:
        artifact = ours[0]
    elif held:
        raise RegistryError(
            f"version {entry.version!r} of {entry.model!r} exists and points at {held[0].get('uri')}; "
            "set register.version to a new name"
        )
    else:
        artifact = registry.add_artifact(version["id"], entry.artifact_body())
    ids = {"model_id": model["id"], "version_id": version["id"], "artifact_id": artifact.get("id")}
    return {"model": entry.model, "version": entry.version, "uri": entry.uri, **ids, "created": created}


def _digest_of(version: dict) -> str | None:
    """The export manifest's sha256 a version was registered with (its ``export_manifest_sha256``), or None."""
    held = (version.get("customProperties") or {}).get("export_manifest_sha256")
    return held.get("string_value") if isinstance(held, dict) else None


def read_export(uri: str) -> tuple[str, bytes, dict, str]:
    """(the URI as registered, the manifest's bytes, metrics.json, the card) of the export at ``uri`` (an object
    store prefix or a local copy), checked: its manifest is there, no export is being written, and metrics.json
    is the file the manifest lists."""
    from trainer.config.base import parse_destination
    from trainer.storage.export import MANIFEST, PARTIAL

    if "://" in uri:
        try:
            dest = parse_destination(uri)
        except ValueError as e:
            raise RegistryError(f"{uri} {e}") from None
        if dest.hub:
            raise RegistryError(f"{uri}: register reads an export on s3://, gs://, az:// or a local path")
        get, where = _store_reader(dest), str(dest)
    else:
        root = Path(uri).resolve()
        get, where = (lambda name: (root / name).read_bytes() if (root / name).is_file() else None), str(root)
    if get(PARTIAL) is not None:
        raise RegistryError(f"{where}: an export is being written there ({PARTIAL}); wait for it, or export again")
    manifest = get(MANIFEST)
    if manifest is None:
        raise RegistryError(f"{where}: no export there (no {MANIFEST}); give the export's prefix")
    raw = get("metrics.json") or b""
    want = json.loads(manifest).get("files", {}).get("metrics.json", {}).get("sha256")
    if hashlib.sha256(raw).hexdigest() != want:
        raise RegistryError(f"{where}: metrics.json is missing or not the one its {MANIFEST} lists; export again")
    return where, manifest, json.loads(raw), (get("README.md") or b"").decode("utf-8", "replace")


def _store_reader(dest):
    import obstore

    from trainer.redirects import Redirected
    from trainer.storage.stores import bucket_store, reason

    try:
        store = bucket_store(dest.scheme, dest.bucket, {"timeout": "60s", "connect_timeout": "10s"})
    except Redirected as e:  # a custom endpoint that redirects elsewhere (trainer/redirects.py)
        raise RegistryError(f"{dest}: {e}") from None
    except Exception as e:  # a builder's complaint: no account (az://), a bad endpoint
        raise RegistryError(f"{dest}: cannot be opened ({reason(e)})") from None

    def get(name: str) -> bytes | None:
        try:
            return bytes(obstore.get(store, dest.prefix + name).bytes())
        except FileNotFoundError:
            return None
        except Exception as e:
            raise RegistryError(f"{dest}: {name} cannot be read ({reason(e)})") from None

    return get


def from_card(card: str) -> tuple[str, str]:
    r"""(base model, job name) as the card states them: "fine-tuned from `BASE`" and its title.

    >>> from_card("---\nx: 1\n---\n\n# run-7\n\nA model, fine-tuned from\n`org/base` with colbert-k8s.")
    ('org/base', 'run-7')
    """
    base = re.search(r"fine-tuned from\s+`([^`]+)`", card)
    title = re.search(r"^# (.+)$", card, re.MULTILINE)
    return (base.group(1) if base else "unknown"), (title.group(1).strip() if title else "unknown")


def register_export(uri: str, rcfg, job: str | None = None) -> dict:
    """``colbert-k8s register``: the export at ``uri`` registered as ``rcfg`` says (the base model and the job's
    name from its card, unless ``job`` is given)."""
    where, manifest, metrics, card = read_export(uri)
    base, titled = from_card(card)
    entry = entry_for(rcfg, where, manifest, metrics, base, job or titled)
    return register(Registry.from_env(rcfg.url), entry)


def preflight(cfg: TrainConfig) -> None:
    """At start, before hours of training: the registry's endpoint is known (config or environment)."""
    from trainer.config.schema import ConfigError

    if cfg.registration is None or cfg.registration.url:
        return
    url = os.environ.get("MODEL_REGISTRY_URL")
    if not url:
        raise ConfigError("register: no registry endpoint; set register.url, or pass --env MODEL_REGISTRY_URL=URL")
    try:
        check_endpoint(url, "MODEL_REGISTRY_URL")
    except RegistryError as e:
        raise ConfigError(f"register: {e}") from None


def after_export(cfg: TrainConfig) -> dict:
    """Rank 0, after ``export.run`` verified the export: register it unless ``registered.json`` says it was."""
    from trainer.config.base import parse_destination
    from trainer.storage.card import origin
    from trainer.storage.export import manifest_for, planned_files

    out = Path(cfg.output_dir)
    uri = str(parse_destination(cfg.export.destination))
    manifest = json.dumps(manifest_for(planned_files(cfg)), indent=2, sort_keys=True).encode() + b"\n"
    entry = entry_for(
        cfg.registration,
        uri,
        manifest,
        json.loads((out / "metrics.json").read_text()),
        origin(cfg.model.name_or_path),
        cfg.tracking.run_name or out.name,
    )
    try:
        done = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        done = {}
    if done.get("uri") == uri and done.get("manifest_sha256") == entry.manifest_sha256:
        log.info("register: %s version %s registered before (%s); not again", done["model"], done["version"], MARKER)
        return done
    try:
        result = register(Registry.from_env(cfg.registration.url), entry)
    except RegistryError as e:
        raise RegisterFailed(f"register {entry.model} version {entry.version}: {e}") from None
    from trainer.atomic import write_text

    write_text(out / MARKER, json.dumps({**result, "manifest_sha256": entry.manifest_sha256}, indent=2) + "\n")
    log.info(
        "register: %s version %s -> %s (%s)",
        entry.model,
        entry.version,
        uri,
        "created" if result["created"] else "found, made by an earlier start",
    )
    return result
