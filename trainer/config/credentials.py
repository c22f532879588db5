"""Values that are credentials, whatever key or flag they came through: one pattern, defined once.

The CLI refuses them in every flag it writes into a manifest, the trainer's config schema refuses them in
every string of the config (the config becomes the job's ConfigMap, readable by anyone who can read the
namespace), and ``operator_cli/chart_schema.py`` writes the same pattern into the chart's
``values.schema.json``. Key names that look like credentials (``HF_TOKEN=...``) are a separate rule, in
``operator_cli/rules.py``.

Hand-written rather than taken from detect-secrets: the chart needs the rule as one regular expression
that Go's regexp (Helm's schema validator) reads as Python does, and detect-secrets' detectors are Python
objects. The formats are the documented token prefixes of the services a training job talks to, and the
signature parameters of signed URLs (Azure SAS, GCS and S3); a 40-hex W&B key has no prefix and is not
caught here (its variable name is).
"""

from __future__ import annotations

import re

__all__ = ["CREDENTIAL_VALUE", "credential_in"]

# (what it looks like, pattern): no look-around, so Python and Go read each the same way
_KINDS: tuple[tuple[str, str], ...] = (
    ("a URL with user:password@ or token@", r"[A-Za-z][A-Za-z0-9+.-]*://[^/@\s]+@"),
    # a signed URL's query (Azure SAS, GCS V4 and V2, S3 presigned, S3's session token): the signature is the secret
    (
        "a signed URL's signature (sig=, X-Goog-Signature=, X-Amz-Signature=, X-Amz-Security-Token=)",
        r"(^|[?&])(sig|Signature|[Xx]-[Gg]oog-[Ss]ignature|[Xx]-[Aa]mz-[Ss]ignature|"
        r"[Xx]-[Aa]mz-[Ss]ecurity-[Tt]oken)=[^&\s]",
    ),
    ("a Hugging Face token (hf_...)", r"hf_[A-Za-z0-9]{20,}"),
    ("a GitHub token (ghp_..., github_pat_...)", r"(gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})"),
    ("a GitLab token (glpat-...)", r"glpat-[A-Za-z0-9_-]{20,}"),
    ("an AWS access key id (AKIA...)", r"(^|[^A-Z0-9])(AKIA|ASIA)[A-Z0-9]{16}([^A-Z0-9]|$)"),
    # OpenAI's sk- + 32 or more letters and digits, or sk-proj-/sk-ant-/... (not a run named my-sk-learn-baseline)
    ("an API key (sk-...)", r"(^|[^A-Za-z0-9])sk-([A-Za-z0-9]{32,}|(proj|ant|svcacct|admin)-[A-Za-z0-9_-]{20,})"),
    ("a Slack token (xox...-)", r"xox[abposr]-[A-Za-z0-9-]{10,}"),
    ("a Google API key (AIza...)", r"AIza[0-9A-Za-z_-]{35}"),
    ("a private key", r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    ("a JSON web token (eyJ....eyJ...)", r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\."),
)
CREDENTIAL_VALUE = "|".join(f"({pattern})" for _, pattern in _KINDS)
_COMPILED = [(kind, re.compile(pattern)) for kind, pattern in _KINDS]


def credential_in(value: str) -> str | None:
    """What credential ``value`` holds (for an error that never shows the value), or None."""
    for kind, pattern in _COMPILED:
        if pattern.search(value):
            return kind
    return None
