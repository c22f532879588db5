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
    """The exception's type and first line, never a credential of a URL in it. A store that found no
    credentials in the environment and asked the instance metadata endpoint instead (off a cloud VM: refused, or
    no answer) is said as that, with the variables to set.

    >>> reason(OSError("GET https://key:secret@host/b failed\\nmore"))
    'OSError: GET https://host/b failed'
    >>> reason(OSError("Generic S3 error: Error performing PUT http://169.254.169.254/latest/api/token: 403"))[:74]
    'no S3 credentials in the environment: set AWS_ACCESS_KEY_ID and AWS_SECRET'
    """
    text = re.sub(r"https?://[^\s@/]*@", "https://", str(e)).strip()
    if missing := _no_credentials(text):
        return missing
    first = text.splitlines()[0] if text else type(e).__name__
    return f"{type(e).__name__}: {first[:200]}"


# obstore's error text per store, and the variables that give it credentials
_CREDENTIALS = {
    "S3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL for MinIO or another S3-compatible store)",
    "GCS": "GOOGLE_APPLICATION_CREDENTIALS (a service account's key file)",
    "MicrosoftAzure": "AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY",
}
# the cloud's instance metadata endpoint (AWS, GCP, Azure): where a client asks when the environment has no credentials
_METADATA = re.compile(r"169\.254\.169\.254|/latest/api/token|/latest/meta-data/|/computeMetadata/|/metadata/identity/")


def _no_credentials(text: str) -> str | None:
    """The line for a store that found no credentials and asked the instance metadata endpoint, else None."""
    if not _METADATA.search(text):
        return None
    store = next((k for k in _CREDENTIALS if f"Generic {k} error" in text), None)
    wanted = _CREDENTIALS.get(store, "the store's credential variables")
    return f"no {store or 'store'} credentials in the environment: set {wanted}"
