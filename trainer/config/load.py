"""Reading a config: a file of bounded YAML, validated into :class:`~trainer.config.schema.TrainConfig`, every
problem one line.

The loader refuses what PyYAML's SafeLoader would accept at a cost (aliases that expand to gigabytes,
duplicate keys that silently win, deep nesting, integers of thousands of digits) and reads YAML 1.2 floats
(``3e-05``, as Helm writes them). :func:`parse_config` turns pydantic's report into one line naming the key
and the fix, and refuses a credential anywhere in the config (it becomes the job's ConfigMap). The CLI
(``operator_cli/spec.py``) and the trainer (``trainer/cli.py``) both read configs through here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from trainer.config.credentials import credential_in
from trainer.config.schema import REMOVED_KEYS, ConfigError, TrainConfig
from trainer.losses import LOSSES

__all__ = [
    "FLOAT_1_2",
    "MAX_CONFIG_BYTES",
    "load_config",
    "load_yaml",
    "parse_config",
    "read_config_text",
]

MAX_CONFIG_BYTES = 1 << 20  # a training config is a page of YAML; a megabyte is already suspicious
MAX_DEPTH = 24
MAX_INT_DIGITS = 30


def _one_line(err: ValidationError, source: str) -> str:
    """Turn pydantic's report into one line naming the key and the fix."""
    errors = err.errors()
    first = errors[0]
    loc = _path(first)
    # a value of a union (a number or auto) fails each member: one message naming every form it may take
    alternatives = [e for e in errors if _path(e) == loc]
    if len(alternatives) > 1:
        first = {**first, "msg": " or ".join(e["msg"].removeprefix("Input should be ") for e in alternatives)}
        first["msg"] = "Input should be " + first["msg"]
    kind = first["type"]
    if kind == "extra_forbidden" and loc in REMOVED_KEYS:
        msg = f"'{loc}' was removed in {REMOVED_KEYS[loc]}; delete the key"
    elif kind == "extra_forbidden":
        msg = f"unknown key '{loc}': remove it or check its spelling"
    elif kind == "missing":
        msg = f"missing required key '{loc}'"
    elif kind == "union_tag_invalid":
        msg = f"'{loc}': {first['msg']}"
    else:
        where = f"'{loc}': " if loc else ""
        text = first["msg"].removeprefix("Value error, ")  # pydantic's prefix for a validator's ValueError
        given = first.get("input")
        # a section's own validator names the values it refuses: echoing the whole section adds a screenful
        if isinstance(given, str) and "://" in given:  # a URL's query may hold a credential no pattern knows
            given = re.sub(r"[?#].*", "?...", given, flags=re.S)
        got = "" if isinstance(given, dict) else f" (got {_clipped(repr(given))})"
        msg = f"{where}{text}{got}"
    more = len(errors) - len(alternatives)
    return f"{source}: {msg}" + (f" (and {more} more)" if more else "")


_UNION_MEMBER = re.compile(r"function-after|constrained-|literal\[|(float|int|str|bool)$")


def _path(error: dict) -> str:
    """The key an error is about, without the tags pydantic inserts into union paths (a loss's name, a member's
    type).

    >>> _path({"loc": ("loss", "contrastive", "temperature", "constrained-float")})
    'loss.temperature'
    """
    loc = ".".join(str(p) for p in error["loc"] if not _UNION_MEMBER.match(str(p)))
    for tag in LOSSES:
        loc = loc.replace(f"loss.{tag}.", "loss.")
    return loc


def _clipped(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, bounded: no aliases (a 548-byte "billion laughs" expands past 2 GB), no
    duplicate keys, no deep nesting, no integers of thousands of digits; and YAML 1.2 floats
    (``3e-05``, which Helm's ``toYaml``/``toJson`` write, is a float, not the string YAML 1.1 makes it)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ConfigError(
                f"line {event.start_mark.line + 1}: YAML aliases (*{event.anchor}) are not allowed in a config; "
                "write the value out"
            )
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise ConfigError(f"line {mark.line + 1}: nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)) or key is None:
                raise ConfigError(f"line {key_node.start_mark.line + 1}: a key must be a plain string")
            if key in seen:
                raise ConfigError(f"line {key_node.start_mark.line + 1}: key {str(key)[:60]!r} appears twice; keep one")
            seen.add(key)
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node):
        if len(node.value.lstrip("+-").replace("_", "")) > MAX_INT_DIGITS:
            line = node.start_mark.line + 1
            raise ConfigError(f"line {line}: an integer of {len(node.value)} digits is out of range")
        return super().construct_yaml_int(node)


_ConfigLoader.add_constructor("tag:yaml.org,2002:int", _ConfigLoader.construct_yaml_int)
FLOAT_1_2 = re.compile(r"^[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$")  # 3e-05: YAML 1.1 has no such float
_ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:float", FLOAT_1_2, list("-+0123456789."))


_SILENT_BREAKS = re.compile("[\x85\u2028\u2029]")  # YAML 1.1 line breaks: a value would change, not fail


def load_yaml(text: str, source: str = "config") -> Any:
    """Parse config YAML with :class:`_ConfigLoader`; every problem is a one-line :class:`ConfigError`."""
    if found := _SILENT_BREAKS.search(text):
        line = text.count("\n", 0, found.start()) + 1
        raise ConfigError(
            f"{source}: line {line} holds U+{ord(found.group()):04X}, a line break to YAML that would silently "
            "change the value it is in; remove it"
        )
    try:
        return yaml.load(text, Loader=_ConfigLoader)  # a SafeLoader subclass
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{source}:{where} is not valid YAML ({getattr(e, 'problem', None) or e})") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None


def read_config_text(path: str | Path) -> str:
    """The config file's text: at most 1 MiB of UTF-8, or one line saying what is wrong."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p} (pass an existing --config FILE.yaml)")
    if p.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{p}: {p.stat().st_size} bytes is too large for a config (at most {MAX_CONFIG_BYTES})")
    try:
        return p.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte {e.start}); save the file as UTF-8") from None


def parse_config(data: Any, source: str = "config") -> TrainConfig:
    """Validate an already-parsed mapping; raise :class:`ConfigError` with one line."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of keys, got {type(data).__name__}")
    _refuse_credentials(data, source)
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_one_line(e, source)) from e


def _refuse_credentials(data: Any, source: str, where: str = "") -> None:
    """No key or string of the config may hold a credential: the config becomes the job's ConfigMap."""
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        path = f"{where}.{key}" if where and isinstance(key, str) else f"{where}[{key}]" if where else str(key)
        for text in (key, value):
            if isinstance(text, str) and (kind := credential_in(text)):
                shown = f"a key under '{where or 'the top level'}' is" if text is key else f"'{path}' holds"
                raise ConfigError(
                    f"{source}: {shown} {kind} (not shown); the config is written into the job's ConfigMap in "
                    "clear: pass credentials as environment variables from a Secret (--secret-env) instead"
                )
        _refuse_credentials(value, source, path)


def load_config(path: str | Path) -> TrainConfig:
    """Read and validate a YAML config file."""
    return parse_config(load_yaml(read_config_text(path), str(path)), str(path))
