"""An obstore store for a bucket, configured from the environment: one reading of ``AWS_ENDPOINT_URL`` and the
region for the sources staged into a pod (``trainer/storage/sources.py``) and the export out of it
(``trainer/storage/export.py``), and one credential-free line for what a store raised. A custom endpoint that
redirects to another host is refused before any credential is sent (``trainer/redirects.py`` says why)."""

from __future__ import annotations

import os
import re
from typing import Any

from trainer.redirects import probe_endpoint

__all__ = ["bucket_store", "custom_endpoint", "reason"]


def bucket_store(scheme: str, bucket: str, client_options: dict[str, Any], **kwargs: Any):
    """``scheme://bucket`` (s3, gs, az) through obstore's ``from_url``. For S3, a custom endpoint
    (``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``: MinIO, moto) is used path-style, plain http allowed when it
    is http, and the region is read from ``AWS_REGION``/``AWS_DEFAULT_REGION`` (default us-east-1); the
    other stores read their own variables themselves."""
    from obstore.store import from_url

    options = dict(client_options)
    if scheme == "s3":
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            kwargs.update(endpoint=endpoint, virtual_hosted_style_request=False)
            options["allow_http"] = endpoint.startswith("http://")
        kwargs["region"] = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    if found := custom_endpoint(scheme):
        setting, endpoint = found
        probe_endpoint(f"{endpoint.rstrip('/')}/{bucket}", setting)
    return from_url(f"{scheme}://{bucket}", client_options=options, **kwargs)


def custom_endpoint(scheme: str) -> tuple[str, str] | None:
    """(the variable, its URL) when the store's endpoint is set in the environment (MinIO, moto, Azurite, a
    proxy) rather than the cloud's own: such an endpoint is asked, without credentials, whether it redirects
    elsewhere (:func:`trainer.redirects.probe_endpoint`), since reqwest would follow a redirect with S3's session
    token in ``x-amz-security-token``."""
    names = {
        "s3": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
        "az": ("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT")
        + (("AZURITE_BLOB_STORAGE_URL",) if os.environ.get("AZURE_STORAGE_USE_EMULATOR") else ()),
    }.get(scheme, ())
    return next(((name, os.environ[name]) for name in names if os.environ.get(name)), None)


def reason(e: BaseException) -> str:
    """The exception's type and first line, never a credential of a URL in it.

    >>> reason(OSError("GET https://key:secret@host/b failed\\nmore"))
    'OSError: GET https://host/b failed'
    """
    text = re.sub(r"https?://[^\s@/]*@", "https://", str(e)).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    return f"{type(e).__name__}: {first[:200]}"
