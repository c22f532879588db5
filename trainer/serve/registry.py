"""The Kubeflow Model Registry's REST API (``/api/model_registry/v1alpha3``), the calls registration makes.

Why not the ``model-registry`` PyPI client: 0.3.18 requires python-dateutil<3, and the CLI's kubernetes 37.0.2
(which the trainer's image carries too) requires >=3, so the two cannot share an environment. These few calls
follow the published OpenAPI spec (kubeflow/model-registry ``api/openapi/model-registry.yaml``) with the
standard library: find a registered model by name (200, or 404), create one (201; 409 when it exists), find a
version by name under it (200 or 404), create one (201), list and add a version's artifacts (200; 201).

The endpoint is ``register.url`` or ``$MODEL_REGISTRY_URL`` (http(s), never with a user or password in it); a
bearer token, when the registry wants one, only ``$MODEL_REGISTRY_TOKEN`` (a Secret through ``--secret-env``),
sent to that endpoint only: a redirect is never followed (``trainer/redirects.py``). Every answer is checked
against the spec's shape (pydantic). Every failure is one line with the call, the HTTP status and the registry's
own message, or what was wrong with its answer; never the token.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request

from pydantic import BaseModel, ConfigDict, ValidationError

from trainer.redirects import opener, redirect_line, shown

__all__ = ["API", "Registry", "RegistryError", "check_endpoint", "metadata"]

API = "/api/model_registry/v1alpha3"
_WHERE = "register.url / MODEL_REGISTRY_URL"


class RegistryError(Exception):
    """A registry call failed: one line naming the call, the status and the registry's message."""

    def __init__(self, line: str, status: int | None = None):
        super().__init__(line)
        self.status = status


# ---- the answers, as the spec shapes them (only what registration reads is required) ----------------------


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow", coerce_numbers_to_str=True)


class RegisteredModel(_Answer):
    id: str
    name: str | None = None


class ModelVersion(_Answer):
    id: str
    name: str | None = None
    customProperties: dict | None = None  # noqa: N815 (the spec's name)


class Artifact(_Answer):
    id: str | None = None
    uri: str | None = None
    artifactType: str | None = None  # noqa: N815


class ArtifactList(_Answer):
    items: list[Artifact] | None = None


def check_endpoint(url: str, where: str) -> str:
    """``url`` (from ``where``) as the registry's endpoint: http(s), a host, no user information. The refusal
    never shows a password.

    >>> check_endpoint("http://u:pw@registry:8080/", "MODEL_REGISTRY_URL")
    Traceback (most recent call last):
    ...
    trainer.serve.registry.RegistryError: MODEL_REGISTRY_URL http://registry:8080/ holds a user name or password; \
give the registry's URL without them, and a token as MODEL_REGISTRY_TOKEN (--secret-env)
    """
    if "@" in url:  # user information, wherever a stray "/" in a password puts the "@": shown after it only
        scheme, _, rest = url.partition("://")
        raise RegistryError(
            f"{where} {scheme}://{rest.rpartition('@')[2][:80]} holds a user name or password; give the "
            "registry's URL without them, and a token as MODEL_REGISTRY_TOKEN (--secret-env)"
        )
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise RegistryError(f"{where} {shown(url)!r} is not an http(s):// URL; give the registry's REST endpoint")
    return url


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
    """One Model Registry endpoint; each method is one REST call of the spec, its answer checked against the
    spec's shape (a login page's 200, ``{}`` or a list is the registry's fault, said in one line)."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30, where: str = _WHERE):
        check_endpoint(url, where)
        self.base, self.token, self.timeout = url.rstrip("/") + API, token, timeout
        self.where = where

    @classmethod
    def from_env(cls, url: str | None) -> Registry:
        if url:
            return cls(url, os.environ.get("MODEL_REGISTRY_TOKEN") or None, where="register.url")
        url = os.environ.get("MODEL_REGISTRY_URL")
        if not url:
            raise RegistryError("no registry: set register.url, or MODEL_REGISTRY_URL in the environment (--env)")
        return cls(url, os.environ.get("MODEL_REGISTRY_TOKEN") or None, where="MODEL_REGISTRY_URL")

    def call(
        self,
        method: str,
        path: str,
        body: dict | None = None,
        query: dict | None = None,
        shape: type[BaseModel] | None = None,
    ) -> dict | None:
        """The answer's JSON (checked against ``shape``), None for a 404 of a find; any other status but 2xx, a
        redirect (never followed: the token stays here) or an answer of another shape is :class:`RegistryError`."""
        url = self.base + path + ("?" + urllib.parse.urlencode(query) if query else "")
        call = f"{method} {API}{path}"
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with opener().open(request, timeout=self.timeout) as answer:
                raw, kind = answer.read(), answer.headers.get_content_type()
        except urllib.error.HTTPError as e:
            if 300 <= e.code < 400:
                fix = f"set {self.where} to the registry's own address (not a proxy or a login page)"
                what = f"{method} {shown(url)}"
                raise RegistryError(redirect_line(what, e.code, e.headers.get("Location"), fix), e.code) from None
            if e.code == 404 and method == "GET" and query:
                return None
            said = _message(e.read())
            raise RegistryError(f"{call}: HTTP {e.code} {e.reason}{': ' + said if said else ''}", e.code) from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise RegistryError(f"{method} {shown(self.base + path)}: no answer ({reason})") from None
        try:
            answer = json.loads(raw or b"{}")
        except ValueError:
            raise RegistryError(
                f"{call}: the registry answered {kind}, not JSON; check that {self.where} is the Model Registry's "
                "REST endpoint (not a proxy or a login page)"
            ) from None
        if shape is not None:
            try:
                shape.model_validate(answer)
            except ValidationError as e:
                raise RegistryError(
                    f"{call}: the registry's answer is not a {shape.__name__} ({_problem(e, answer)}); check that "
                    f"{self.where} is the Model Registry's REST endpoint (API {API})"
                ) from None
        return answer

    def find_model(self, name: str) -> dict | None:
        return self.call("GET", "/registered_model", query={"name": name}, shape=RegisteredModel)

    def create_model(self, body: dict) -> dict:
        return self.call("POST", "/registered_models", body, shape=RegisteredModel)

    def find_version(self, model_id: str, name: str) -> dict | None:
        query = {"name": name, "parentResourceId": model_id}
        return self.call("GET", "/model_version", query=query, shape=ModelVersion)

    def create_version(self, model_id: str, body: dict) -> dict:
        body = {**body, "registeredModelId": model_id}
        return self.call("POST", f"/registered_models/{model_id}/versions", body, shape=ModelVersion)

    def artifacts(self, version_id: str) -> list[dict]:
        return self.call("GET", f"/model_versions/{version_id}/artifacts", shape=ArtifactList).get("items") or []

    def add_artifact(self, version_id: str, body: dict) -> dict:
        return self.call("POST", f"/model_versions/{version_id}/artifacts", body, shape=Artifact)


def _problem(e: ValidationError, answer) -> str:
    """What is wrong with an answer, in a few words: its JSON type, or the first field pydantic refused."""
    if not isinstance(answer, dict):
        kinds = {list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
        return f"got a JSON {kinds.get(type(answer), 'null')}"
    first = e.errors()[0]
    where = ".".join(map(str, first["loc"])) or "the answer"
    return f"{where}: {first['msg']}"


def _message(raw: bytes) -> str:
    """The spec's Error body (``{"code", "message"}``), first line; else the text's first line."""
    try:
        text = json.loads(raw).get("message", "")
    except (ValueError, AttributeError):
        text = raw.decode("utf-8", "replace")
    return (text.strip().splitlines() or [""])[0][:200]
