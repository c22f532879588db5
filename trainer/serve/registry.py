"""The Kubeflow Model Registry's REST API (``/api/model_registry/v1alpha3``), the calls registration makes.

Why not the ``model-registry`` PyPI client: 0.3.18 requires python-dateutil<3, and the CLI's kubernetes 37.0.2
(which the trainer's image carries too) requires >=3, so the two cannot share an environment. These few calls
follow the published OpenAPI spec (kubeflow/model-registry ``api/openapi/model-registry.yaml``) with the
standard library: find a registered model by name (200, or 404), create one (201; 409 when it exists), find a
version by name under it (200 or 404), create one (201), list and add a version's artifacts (200; 201).

The endpoint is ``register.url`` or ``$MODEL_REGISTRY_URL``; a bearer token, when the registry wants one, only
``$MODEL_REGISTRY_TOKEN`` (a Secret through ``--secret-env``). Every failure is one line with the call, the
HTTP status and the registry's own message; never the token.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request

__all__ = ["API", "Registry", "RegistryError", "metadata"]

API = "/api/model_registry/v1alpha3"


class RegistryError(Exception):
    """A registry call failed: one line naming the call, the status and the registry's message."""

    def __init__(self, line: str, status: int | None = None):
        super().__init__(line)
        self.status = status


def metadata(value) -> dict:
    """A custom property as the registry types it (MetadataValue).

    >>> metadata(0.5), metadata(3), metadata("x")
    ({'metadataType': 'MetadataDoubleValue', 'double_value': 0.5}, {'metadataType': 'MetadataIntValue', \
'int_value': '3'}, {'metadataType': 'MetadataStringValue', 'string_value': 'x'})
    """
    if isinstance(value, bool):
        return {"metadataType": "MetadataBoolValue", "bool_value": value}
    if isinstance(value, int):
        return {"metadataType": "MetadataIntValue", "int_value": str(value)}
    if isinstance(value, float):
        return {"metadataType": "MetadataDoubleValue", "double_value": value}
    return {"metadataType": "MetadataStringValue", "string_value": str(value)}


class Registry:
    """One Model Registry endpoint; each method is one REST call of the spec."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30):
        self.base, self.token, self.timeout = url.rstrip("/") + API, token, timeout

    @classmethod
    def from_env(cls, url: str | None) -> Registry:
        url = url or os.environ.get("MODEL_REGISTRY_URL")
        if not url:
            raise RegistryError("no registry: set register.url, or MODEL_REGISTRY_URL in the environment (--env)")
        return cls(url, os.environ.get("MODEL_REGISTRY_TOKEN") or None)

    def call(self, method: str, path: str, body: dict | None = None, query: dict | None = None) -> dict | None:
        """The answer's JSON, None for a 404 of a find; any other status but 2xx is :class:`RegistryError`."""
        url = self.base + path + ("?" + urllib.parse.urlencode(query) if query else "")
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                return json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as e:
            if e.code == 404 and method == "GET" and query:
                return None
            said = _message(e.read())
            raise RegistryError(
                f"{method} {path}: HTTP {e.code} {e.reason}{': ' + said if said else ''}", e.code
            ) from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise RegistryError(f"{method} {self.base}{path}: no answer ({reason})") from None

    def find_model(self, name: str) -> dict | None:
        return self.call("GET", "/registered_model", query={"name": name})

    def create_model(self, body: dict) -> dict:
        return self.call("POST", "/registered_models", body)

    def find_version(self, model_id: str, name: str) -> dict | None:
        return self.call("GET", "/model_version", query={"name": name, "parentResourceId": model_id})

    def create_version(self, model_id: str, body: dict) -> dict:
        return self.call("POST", f"/registered_models/{model_id}/versions", {**body, "registeredModelId": model_id})

    def artifacts(self, version_id: str) -> list[dict]:
        return (self.call("GET", f"/model_versions/{version_id}/artifacts") or {}).get("items") or []

    def add_artifact(self, version_id: str, body: dict) -> dict:
        return self.call("POST", f"/model_versions/{version_id}/artifacts", body)


def _message(raw: bytes) -> str:
    """The spec's Error body (``{"code", "message"}``), first line; else the text's first line."""
    try:
        text = json.loads(raw).get("message", "")
    except (ValueError, AttributeError):
        text = raw.decode("utf-8", "replace")
    return (text.strip().splitlines() or [""])[0][:200]
