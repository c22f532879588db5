"""``KEY=VALUE`` overrides of a config mapping: ``colbert-train --set training.learning_rate=3e-5``.

A sweep's trials share one config (one ConfigMap on a cluster) and differ in a few values: a Katib trial or an
OptimizationJob trial passes its values as ``--set`` arguments, and ``colbert-k8s tune`` writes each local
trial's config with the same function. The value is read as one YAML scalar by the config's own loader
(``3e-05`` is a float, ``true`` a bool, ``cosine`` a string), then the whole config is validated by the
schema as usual, so an override is refused exactly as the same value written in the file would be.

>>> apply_overrides({"training": {"max_steps": 10}}, ["training.learning_rate=3e-05", "mine.negatives=2"])
{'training': {'max_steps': 10, 'learning_rate': 3e-05}, 'mine': {'negatives': 2}}
"""

from __future__ import annotations

import copy
import re
from typing import Any

from trainer.config import ConfigError

__all__ = ["KEY", "apply_overrides", "parse_override", "parse_value", "set_key"]

KEY = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*")
"""A dotted config key: lowercase sections and fields, as the schema names them."""


def parse_value(text: str) -> Any:
    """One YAML scalar, read by the config's loader (YAML 1.2 floats, no aliases).

    >>> parse_value("1e-5"), parse_value("3"), parse_value("cosine"), parse_value("true")
    (1e-05, 3, 'cosine', True)
    """
    from trainer.config_yaml import load_yaml

    value = load_yaml(text, "a --set value") if text.strip() else None
    if isinstance(value, (dict, list)):
        raise ConfigError(f"--set value {text!r} must be one value, not a YAML {type(value).__name__}")
    return value


def parse_override(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> (key, value), or one line saying what is wrong."""
    key, sep, value = text.partition("=")
    if not sep or not KEY.fullmatch(key):
        raise ConfigError(f"--set must be KEY=VALUE with a dotted config key like training.learning_rate, got {text!r}")
    return key, parse_value(value)


def set_key(data: dict[str, Any], key: str, value: Any) -> None:
    """Set ``a.b.c`` in ``data``, creating the sections on the way (the schema then says whether they may be)."""
    *sections, leaf = key.split(".")
    at = data
    for i, part in enumerate(sections):
        nxt = at.get(part)
        if nxt is None:
            nxt = at[part] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {key}: '{'.'.join(sections[: i + 1])}' is a value, not a section")
        at = nxt
    at[leaf] = value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """A copy of ``data`` with every ``KEY=VALUE`` set, in order."""
    out = copy.deepcopy(data)
    for text in overrides:
        set_key(out, *parse_override(text))
    return out
