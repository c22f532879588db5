"""``--set KEY=VALUE``: one config key changed from the command line, as Helm's ``--set`` and HF's overrides do.

The one reading of ``--set``, wherever it is given: ``colbert-k8s submit``/``render``/``local``/``tune`` apply
it to ``--config`` (:func:`with_overrides`), and ``colbert-train --set`` applies it in the pod
(:func:`parse_override` and :func:`apply`: a Katib trial or an OptimizationJob trial passes its values so,
since a sweep's trials share one config, one ConfigMap on a cluster), so both sides refuse a key or a value in
the same words.

The key is dotted (``training.max_steps``) and checked against :class:`~trainer.config.schema.TrainConfig` one
part at a time, so a typo is one line with the nearest key (``did you mean 'training.max_steps'?``) before
anything else is read. The value is YAML (``100`` an int, ``5e-5`` a float, ``[]`` a list, ``bm25`` a
string), read by the same bounded loader as a config file. A section that is not there is created
(``index.nbits=4`` asks for an index). The merged config is then validated whole, as a file is, so an override
is refused exactly as the same value written in the file would be, and written back as YAML
(:func:`with_overrides`): the text a job ships, with a first line naming the overrides. :data:`KEY` and
:func:`parse_value` are the key's syntax and one value, as ``colbert-k8s tune --param KEY=SPACE`` reads them.
Pydantic and PyYAML only: the CLI applies overrides without torch.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from typing import Any

import yaml
from pydantic import BaseModel

from trainer.config.credentials import credential_in
from trainer.config.load import FLOAT_1_2, load_yaml, parse_config
from trainer.config.schema import REMOVED_KEYS, ConfigError, TrainConfig

__all__ = ["KEY", "apply", "config_keys", "parse_override", "parse_value", "with_overrides"]

KEY = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*")
"""A dotted config key's syntax: lowercase sections and fields, as the schema names them (the chart's
``tune.params`` pattern, and ``--param``'s first check)."""


def parse_value(text: str) -> Any:
    """One YAML value, read by the config's loader (YAML 1.2 floats, no aliases): a point of a ``--param`` space.

    >>> parse_value("1e-5"), parse_value("3"), parse_value("cosine"), parse_value("true")
    (1e-05, 3, 'cosine', True)
    """
    value = load_yaml(text, "a --set value") if text.strip() else None
    if isinstance(value, (dict, list)):
        raise ConfigError(f"--set value {text!r} must be one value, not a YAML {type(value).__name__}")
    return value


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models a field's annotation holds: itself, or the members of an Optional or a union."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) is typing.Annotated:
        return _models(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _models(arg)]
    return []


def _fields(models: list[type[BaseModel]]) -> dict[str, Any]:
    """Every key the models take, with its annotation (a union's members together: ``loss.mini_batch_size``
    is a key of ``cached-contrastive``; the schema says which names allow it)."""
    out: dict[str, Any] = {}
    for model in models:
        for name, field in model.model_fields.items():
            out.setdefault(name, field.annotation)
    return out


def config_keys(models: list[type[BaseModel]] | None = None, prefix: str = "") -> list[str]:
    """Every dotted key of the schema, sections and values: what a did-you-mean chooses from.

    >>> "training.max_steps" in config_keys() and "mine.teacher.name_or_path" in config_keys()
    True
    """
    out = []
    for name, annotation in _fields(models or [TrainConfig]).items():
        key = f"{prefix}{name}"
        out.append(key)
        if inner := _models(annotation):
            out += config_keys(inner, f"{key}.")
    return out


def _is_text(annotation: Any) -> bool:
    """Whether a field holds text only (``str``, a ``Location``, an optional one): ``run_name=2024`` is then
    the string "2024", as the user meant, not the int YAML reads."""
    if annotation is str:
        return True
    if typing.get_origin(annotation) is typing.Annotated:
        return _is_text(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return len(args) == 1 and _is_text(args[0])
    return False


def _check_key(parts: list[str]) -> Any:
    """Each part of the key names a key of the section before it, else one line with the nearest key;
    returns the last key's annotation."""
    models: list[type[BaseModel]] = [TrainConfig]
    annotation: Any = None
    for i, part in enumerate(parts):
        key = ".".join(parts[: i + 1])
        if not models:
            raise ConfigError(f"--set {key}: '{'.'.join(parts[:i])}' is a value, not a section with keys")
        fields = _fields(models)
        if part not in fields and key in REMOVED_KEYS:
            raise ConfigError(f"--set: '{key}' was removed in {REMOVED_KEYS[key]}; delete the --set")
        if part not in fields:
            near = difflib.get_close_matches(key, config_keys(), n=1, cutoff=0.6)
            near += difflib.get_close_matches(part, [k for k in config_keys() if k.endswith("." + part)], n=1)
            hint = f"; did you mean '{near[0]}'?" if near else "; see docs/trainer.md for every key"
            raise ConfigError(f"--set: unknown key '{key}'{hint}")
        annotation = fields[part]
        models = _models(annotation)
    return annotation


def parse_override(item: str) -> tuple[list[str], Any]:
    """``KEY=VALUE`` -> (the key's parts, the value read as YAML); the key checked against the schema. An
    error names the key, never the value (it may hold a credential, which the whole config then refuses).

    >>> parse_override("training.learning_rate=5e-5")
    (['training', 'learning_rate'], 5e-05)
    >>> parse_override("data.train.columns.negatives=[]")
    (['data', 'train', 'columns', 'negatives'], [])
    >>> parse_override("tracking.run_name=2024")  # a text field: the text, not YAML's int
    (['tracking', 'run_name'], '2024')
    """
    key, sep, text = item.partition("=")
    parts = key.strip().split(".")
    # the text is not echoed: it may be a value, even a token; nor a key no schema key could look like
    if not sep or not all(p.strip() for p in parts) or not key.isprintable() or credential_in(key):
        raise ConfigError("--set takes KEY=VALUE with a dotted config key, e.g. --set training.max_steps=100")
    annotation = _check_key(parts)
    value = load_yaml(text, f"--set {key}")
    if _is_text(annotation) and isinstance(value, (int, float, bool)):
        value = text.strip()
    return parts, value


def apply(data: dict, parts: list[str], value: Any) -> dict:
    """``data`` with the key set to ``value`` (sections created where missing; the input is not changed).

    >>> apply({"training": {"epochs": 1}}, ["training", "max_steps"], 10)
    {'training': {'epochs': 1, 'max_steps': 10}}
    """
    out = dict(data)
    head, rest = parts[0], parts[1:]
    if not rest:
        out[head] = value
        return out
    inner = out.get(head)
    out[head] = apply(inner if isinstance(inner, dict) else {}, rest, value)
    return out


class _Dumper(yaml.SafeDumper):
    """PyYAML's dumper, knowing YAML 1.2 floats as the loader does: the string "1e5" is quoted, so that it
    reads back as the string it was."""


_Dumper.add_implicit_resolver("tag:yaml.org,2002:float", FLOAT_1_2, list("-+0123456789."))


def with_overrides(text: str, overrides: tuple[str, ...] | list[str], source: str = "config") -> str:
    """The config ``text`` with every ``--set`` applied, validated, as YAML text; ``text`` itself when there
    is none (the file as written, comments included)."""
    if not overrides:
        return text
    data = load_yaml(text, source)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of keys, got {type(data).__name__}")
    for item in overrides:
        data = apply(data, *parse_override(item))
    keys = [item.partition("=")[0].strip() for item in overrides]  # checked against the schema: plain words
    parse_config(data, f"{source} with --set {', '.join(keys)}")
    head = f"# the --config file with --set {', '.join(keys)} (written by colbert-k8s; its comments are not kept)\n"
    return head + yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True)
