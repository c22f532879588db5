"""Every validation rule for names and values, defined once.

The CLI checks values with :func:`full` (the whole string must match: ``re.match`` with ``$`` lets
``"job\\n"`` through, since ``$`` also matches before a final newline), and ``chart_schema.py`` writes the
same patterns into the chart's ``values.schema.json``. Patterns are plain ``^...$`` regular expressions
without look-around, so Go's regexp (Helm's schema validator) reads them exactly as Python does.
"""

from __future__ import annotations

import re

__all__ = [
    "PATTERNS",
    "full",
    "credential_like",
    "reserved_env",
    "has_control_chars",
    "CREDENTIAL_DENY",
    "CREDENTIAL_ALLOW",
    "RESERVED_ENV",
    "RESERVED_ENV_PREFIXES",
    "CONTROL_CHARS",
    "reserved_env_pattern",
]

PATTERNS: dict[str, str] = {
    # RFC 1035 label: job names (they become pod host names); at most 63 characters
    "dns1035": r"^[a-z]([-a-z0-9]*[a-z0-9])?$",
    # RFC 1123 label: namespaces
    "dns1123_label": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
    # RFC 1123 subdomain: Secrets, PVCs, service accounts, priority classes; at most 253
    "dns1123": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
    # label and annotation keys: [prefix/]name, name at most 63, prefix a subdomain of at most 253
    "qualified_name": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$",
    "label_value": r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$",
    # a positive Kubernetes quantity (0, 0Gi or 0.0 would be a limit nothing fits in)
    # (Kubernetes' grammar: a binary or decimal suffix, or a decimal exponent as in 1e9)
    "quantity": r"^([1-9][0-9]*(\.[0-9]+)?|0\.[0-9]*[1-9][0-9]*)([eE][+-]?[0-9]+|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$",
    "env_name": r"^[A-Za-z_][A-Za-z0-9_]*$",
    "secret_key": r"^[-._a-zA-Z0-9]+$",
    # REGISTRY/NAME[:TAG][@ALGO:DIGEST]: an @ only before a digest, so no user:password@ can pass
    "image": r"^[A-Za-z0-9][A-Za-z0-9._/:-]*(@[A-Za-z][A-Za-z0-9_+.-]*:[0-9a-fA-F]{32,})?$",
    # a MIG profile as the NVIDIA device plugin names its resources (nvidia.com/mig-<profile>): 1g.10gb,
    # 3g.40gb, 1g.10gb+me, 1c.2g.20gb (a compute instance of a 2g instance)
    "mig_profile": r"^([1-7]c\.)?[1-7]g\.[1-9][0-9]{0,3}gb(\+me)?$",
    # any string the chart writes: no C0 control characters except tab/newline, no DEL, no C1
    "printable": r"^[^\x00-\x08\x0b-\x1f\x7f-\x9f]*$",
}
MAX_LENGTH = {"dns1035": 63, "dns1123_label": 63, "dns1123": 253, "qualified_name": 317, "image": 512}

# Credential-looking variable names belong in --secret-env, never in a manifest in clear.
CREDENTIAL_DENY = (
    r"(?i)(TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|PRIVATE|CREDENTIAL|API_?KEY|ACCESS_?KEY|AUTH|COOKIE|"
    r"_KEY$|^KEY$|_PAT$|^PAT$|_PWD$|^PWD_|DSN$|CONNECTION_?STRING|CONN_?STR|DATABASE_URL|WEBHOOK|SIGNING)"
)
# ... except these well-known harmless names (tokenizer settings, not tokens)
CREDENTIAL_ALLOW = r"^(TOKENIZERS_[A-Z0-9_]*|HF_HUB_DISABLE_[A-Z0-9_]*|PYTORCH_[A-Z0-9_]*)$"

# Set by the Training Operator, the Trainer, torchrun or the manifest itself: a user value would
# silently break the rendezvous or the workspace.
RESERVED_ENV = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "PYTHONUNBUFFERED",
    "HF_HOME",
)
RESERVED_ENV_PREFIXES = ("PET_", "TORCHELASTIC_")
CONTROL_CHARS = re.compile(PATTERNS["printable"].replace("^[^", "[").replace("]*$", "]"))

_COMPILED = {k: re.compile(v) for k, v in PATTERNS.items()}
_DENY, _ALLOW = re.compile(CREDENTIAL_DENY), re.compile(CREDENTIAL_ALLOW)


def full(kind: str, value: str) -> bool:
    """True when all of ``value`` matches rule ``kind`` and fits its length limit."""
    if not isinstance(value, str) or len(value) > MAX_LENGTH.get(kind, 1 << 20):
        return False
    if kind == "qualified_name" and "/" in value and len(value.split("/")[0]) > 253:
        return False
    return _COMPILED[kind].fullmatch(value) is not None


def credential_like(name: str) -> bool:
    return bool(_DENY.search(name)) and not _ALLOW.fullmatch(name)


def reserved_env(name: str) -> bool:
    return name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES)


def has_control_chars(value: str) -> bool:
    return bool(CONTROL_CHARS.search(value))


def reserved_env_pattern() -> str:
    """RESERVED_ENV as one anchored pattern, for the chart's schema."""
    names = "|".join(RESERVED_ENV)
    prefixes = "|".join(f"{p}.*" for p in RESERVED_ENV_PREFIXES)
    return f"^({names}|{prefixes})$"
