"""``register NAME|URI``: a finished job's export, or any export, as a version in the Kubeflow Model Registry.

    colbert-k8s register my-job                          (its config's export.destination and register: section)
    colbert-k8s register s3://models/run-1/ --model colbert-docs [--version v1] [--label nfcorpus]

The registry's endpoint is ``--registry-url`` or ``$MODEL_REGISTRY_URL``; its token, if it wants one, only
``$MODEL_REGISTRY_TOKEN``. The export is read where it is (its manifest, metrics.json and card; credentials
from the environment, as the trainer reads them), so this needs the ``train`` extra (obstore). The job
registers itself when its config has ``register:``; this command is for an export made without it, and is
idempotent alike: a version already there for this export is found, not made again.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from operator_cli.commands.base import Command, cluster_of, cluster_options, job_name, namespace_option
from operator_cli.errors import CliError

__all__ = ["job_export", "register_cmd"]


def _settings(o: dict, section: dict | None):
    """The register: section (the job's, when NAME was given) with the flags over it, validated."""
    from pydantic import ValidationError

    from trainer.config.schema import RegisterConfig

    values = dict(section or {})
    for key, flag in (
        ("name", "model"),
        ("version", "version"),
        ("description", "description"),
        ("storage_key", "storage_key"),
        ("url", "registry_url"),
    ):
        if o[flag] is not None:
            values[key] = o[flag]
    if o["label"]:
        values["labels"] = list(o["label"])
    if not values.get("name"):
        raise CliError("no registered model name", hint="pass --model NAME (or give the job a register: section)")
    try:
        return RegisterConfig(**values)
    except ValidationError as e:
        first = e.errors()[0]
        raise CliError(f"register.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def job_export(o: dict, name: str) -> tuple[str, dict | None]:
    """A job's export destination and register: section, from its config (its ConfigMap)."""
    from trainer.config.load import load_yaml, parse_config
    from trainer.config.schema import ConfigError

    text = cluster_of(o).config_text(job_name(name))
    if text is None:
        raise CliError(f"job {name} has no config in the cluster", hint="give the export's URI instead")
    try:
        cfg = parse_config(load_yaml(text, f"job {name}'s config"), f"job {name}'s config")
    except ConfigError as e:
        raise CliError(str(e)) from None
    if cfg.export is None:
        raise CliError(
            f"job {name} exported nothing (its config has no export: section)",
            hint="a model must be exported to be registered",
        )
    section = cfg.registration.model_dump(exclude_none=True) if cfg.registration else None
    return cfg.export.destination, section


def _export_hint(uri: str) -> str:
    """What to check when the export cannot be read: the store's environment, or the folder."""
    if "://" not in uri:
        return "the export's side, not the registry: give the folder an export wrote (colbert-k8s-export.json in it)"
    return "the export's side, not the registry: check the URI (an export's prefix) and the store's variables here"


@click.command("register", cls=Command)
@click.argument("target", metavar="NAME|URI")
@click.option("--model", help="The registered model's name (default: the job's register.name).")
@click.option("--version", help="The version's name (default: the job's name and the export manifest's hash).")
@click.option("--description", help="The version's description.")
@click.option("--label", multiple=True, help="A label on the version (repeatable).")
@click.option("--storage-key", help="The storage Secret a KServe deployment fetches the export with.")
@click.option("--registry-url", help="The registry's REST endpoint (default: $MODEL_REGISTRY_URL).")
@namespace_option
@cluster_options
def register_cmd(target: str, **o) -> None:
    """Register an export in the Kubeflow Model Registry: a model version pointing at it, with its figures."""
    remote = "://" in target or Path(target).is_dir()
    uri, section = (target, None) if remote else job_export(o, target)
    settings = _settings(o, section)
    try:
        from trainer.serve.register import entry_for, from_card, read_export, register
        from trainer.serve.registry import Registry, RegistryError
    except ModuleNotFoundError as e:
        raise CliError(f"{e.name} is not installed", hint="pip install 'colbert-k8s[train]'") from None
    try:  # the export's side: the object store (or the folder) it is in
        where, manifest, metrics, card = read_export(uri)
    except RegistryError as e:
        raise CliError(f"reading the export: {e}", hint=_export_hint(uri)) from None
    base, titled = from_card(card)
    entry = entry_for(settings, where, manifest, metrics, base, titled if remote else target)
    try:  # the registry's side
        result = register(Registry.from_env(settings.url), entry)
    except RegistryError as e:
        raise CliError(
            f"the model registry: {e}", hint="check --registry-url / MODEL_REGISTRY_URL and MODEL_REGISTRY_TOKEN"
        ) from None
    said = "registered" if result["created"] else "already registered"
    click.echo(f"{said}: {result['model']} version {result['version']} -> {result['uri']}")
    click.echo(json.dumps(result, indent=2), err=True)
