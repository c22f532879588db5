"""What a flag's text becomes: ``K=V`` pairs, tolerations, secret references, ``MIN:MAX``, and the NCCL
presets ``--nccl`` names. Each is parsed once, here, so the templates only see clean, typed values, and
each error is one line that never echoes a value that could be a secret (:func:`shown`).

>>> parse_pairs(["a=1", "b=x=y"], "--env"), parse_elastic("1:4")
({'a': '1', 'b': 'x=y'}, (1, 4))
"""

from __future__ import annotations

import hashlib
import json
import secrets
import string
from dataclasses import dataclass
from typing import Any

from operator_cli import rules
from operator_cli.constants import MAX_NODES
from operator_cli.errors import CliError

__all__ = [
    "EFFECTS",
    "NCCL_PRESETS",
    "derived_name",
    "SecretRef",
    "generate_name",
    "parse_elastic",
    "parse_pairs",
    "parse_secret_env",
    "parse_secret_envs",
    "parse_toleration",
    "shown",
]

EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}

NCCL_PRESETS: dict[str, dict[str, str]] = {
    # TCP sockets over the pod network: works on every cluster.
    "socket": {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "WARN"},
    # InfiniBand/RoCE for data, the pod network only for bootstrap.
    "ib": {"NCCL_IB_DISABLE": "0", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_NET_GDR_LEVEL": "PHB", "NCCL_DEBUG": "WARN"},
}


@dataclass(frozen=True)
class SecretRef:
    """``--secret-env VAR=SECRET/KEY``: a key of a Secret, never its value."""

    secret: str
    key: str


def shown(value: str, limit: int = 80) -> str:
    """A user value fit to echo in an error: never one that could be a secret, never unbounded."""
    if not rules.full("printable", value) or len(value) > limit or "@" in value:  # user:password@host
        return f"a {len(value)}-character value (not shown)"
    return repr(value)


def parse_pairs(values: tuple[str, ...] | list[str], flag: str) -> dict[str, str]:
    """``("a=1", "b=2")`` -> ``{"a": "1", "b": "2"}``; a missing ``=`` or a repeated key is one clear error.

    Values are never echoed (``--env "=$TOKEN"`` must not print the token)."""
    out: dict[str, str] = {}
    for raw in values:
        key, sep, value = raw.partition("=")
        if not sep:
            raise CliError(f"{flag} must be KEY=VALUE, got a value without KEY= (not shown)")
        if not key:
            raise CliError(f"{flag} must be KEY=VALUE, got an empty KEY")
        if key in out:
            raise CliError(f"{flag} {shown(key)} is given twice; keep one")
        if rules.has_control_chars(value):
            raise CliError(f"{flag} {shown(key)}: the value holds control characters; remove them")
        out[key] = value
    return out


def parse_toleration(raw: str) -> dict[str, str]:
    """``key[=value]:Effect`` -> a toleration (``Exists`` when no value is given)."""
    body, sep, effect = raw.rpartition(":")
    if not sep or effect not in EFFECTS or not body:
        raise CliError(f"--toleration must be KEY[=VALUE]:EFFECT with EFFECT in {sorted(EFFECTS)}, got {shown(raw)}")
    key, eq, value = body.partition("=")
    if not rules.full("qualified_name", key):
        raise CliError(f"--toleration key must be a label key, got {shown(key)}")
    if eq and not rules.full("label_value", value):
        raise CliError(f"--toleration value for {key} must be a label value, got {shown(value)}")
    tol = {"key": key, "operator": "Equal" if eq else "Exists", "effect": effect}
    if eq:
        tol["value"] = value
    return tol


def parse_secret_env(raw: str) -> tuple[str, SecretRef]:
    """``VAR=secret/key`` -> ``("VAR", SecretRef("secret", "key"))``."""
    var, sep, ref = raw.partition("=")
    secret, slash, key = ref.partition("/")
    if not sep or not slash or not var or not secret or not key:
        # the argument may be a pasted secret value: name it only when it starts like a variable name
        what = (
            f"{var!r}=..." if sep and rules.full("env_name", var) else "a value that is not VAR=SECRET/KEY (not shown)"
        )
        raise CliError(f"--secret-env must be VAR=SECRET_NAME/KEY, got {what}")
    if not rules.full("env_name", var):
        raise CliError(f"--secret-env variable must be a valid environment variable name, got {shown(var)}")
    if rules.reserved_env(var):
        raise CliError(f"--secret-env {var} is set by the Training Operator or this tool; remove it")
    # what follows '=' may be a pasted secret value (it often contains '/'): describe it, never echo it
    if not rules.full("dns1123", secret):
        raise CliError(
            f"--secret-env {var}: the part before '/' must name a Secret (a DNS-1123 name: lowercase letters, "
            "digits, '-', '.'); it is not shown, in case a secret value was pasted there"
        )
    if not rules.full("secret_key", key):
        raise CliError(
            f"--secret-env {var}: the part after '/' must be a key of the Secret ([-._a-zA-Z0-9]+); "
            "it is not shown, in case a secret value was pasted there"
        )
    return var, SecretRef(secret, key)


def parse_secret_envs(values: tuple[str, ...] | list[str]) -> dict[str, SecretRef]:
    """Every ``--secret-env``; a variable given twice is refused (the pod would get only one of them)."""
    out: dict[str, SecretRef] = {}
    for raw in values:
        var, ref = parse_secret_env(raw)
        if var in out:
            raise CliError(f"--secret-env {var} is given twice; keep one")
        out[var] = ref
    return out


def parse_elastic(raw: str) -> tuple[int, int]:
    """``--elastic MIN:MAX`` -> ``(MIN, MAX)``: the node counts the job may shrink to and grow to."""
    low, sep, high = raw.partition(":")
    if not (sep and low.isdigit() and high.isdigit()):
        raise CliError(f"--elastic must be MIN:MAX node counts like 1:4, got {shown(raw)}")
    low_n, high_n = int(low), int(high)
    if not 1 <= low_n <= high_n <= MAX_NODES:
        raise CliError(f"--elastic {low_n}:{high_n} must have 1 <= MIN <= MAX <= {MAX_NODES}")
    return low_n, high_n


def generate_name(prefix: str = "colbert") -> str:
    """A random name: ``colbert-`` and five random characters (a DNS-1035 label)."""
    alphabet = string.ascii_lowercase + string.digits
    return f"{prefix}-{''.join(secrets.choice(alphabet) for _ in range(5))}"


def derived_name(config_text: str, options: dict[str, Any], prefix: str = "colbert") -> str:
    """``--name``'s default: ``colbert-`` and 8 hex digits of a sha256 of the config and the options, so a
    rendered file kept in git does not change on every run, and the same job submitted twice is one 409.

    >>> derived_name("a: 1", {"nodes": 2}) == derived_name("a: 1", {"nodes": 2}) != derived_name("a: 2", {})
    True
    """
    blob = json.dumps({"config": config_text, "options": options}, sort_keys=True, default=repr)
    return f"{prefix}-{hashlib.sha256(blob.encode()).hexdigest()[:8]}"
