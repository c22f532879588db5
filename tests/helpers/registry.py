"""A stand-in for the Kubeflow Model Registry on 127.0.0.1: the REST endpoints registration calls, with the
spec's status codes (kubeflow/model-registry ``api/openapi/model-registry.yaml``, v1alpha3).

Served: ``GET /registered_model?name=`` (200, 404), ``POST /registered_models`` (201; 400 without a name; 409
for a name taken), ``GET /model_version?name=&parentResourceId=`` (200, 404), ``POST
/registered_models/{id}/versions`` (201; 404 for no such model; 409 for a name taken), ``GET`` and ``POST
/model_versions/{id}/artifacts`` (200 with ``items``; 201), ``GET /registered_models/{id}/versions`` (200);
a 401 without the bearer token when one is set; errors as the spec's ``{"code", "message"}``. ``stall`` holds
the answer to one call after doing it (a registration killed between the registry's work and its answer);
``odd`` answers one call 200 with a body of another shape (a login page, ``{}``, a list).

What the real registry does that this does not: persistence (MySQL/PostgreSQL through its own schema),
pagination, ``filterQuery``, ``orderBy``, ``PATCH`` and states (ARCHIVED), ``externalId`` uniqueness, server
timestamps, the schema's full validation (id patterns, every MetadataValue kind), serving environments and
inference services, and the authentication in front of it (Istio, an OAuth proxy): here a bearer string is
compared, nothing more.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.helpers import free_port
from trainer.serve.registry import API

__all__ = ["RegistryStandIn"]


class RegistryStandIn:
    def __init__(self, token: str | None = None):
        self.token, self.calls, self.stall = token, [], None  # stall: (method, path prefix) to hold
        # odd: (method, path prefix, content type, body): answered 200 with that body instead (a proxy, a wrong API)
        self.odd: tuple[str, str, str, bytes] | None = None
        self.stalled, self.release = threading.Event(), threading.Event()
        self.models: dict[str, dict] = {}
        self.versions: dict[str, dict] = {}
        self.artifacts: dict[str, list[dict]] = {}
        self._ids, self._lock = 0, threading.Lock()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                stand_in._serve(self, "GET")

            def do_POST(self):
                stand_in._serve(self, "POST")

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def posts(self) -> list[str]:
        return [path for method, path in self.calls if method == "POST"]

    # ---- the endpoints ----------------------------------------------------------------------------------

    def _new_id(self) -> str:
        self._ids += 1
        return str(self._ids)

    def _answer(self, method: str, path: str, query: dict, body: dict | None) -> tuple[int, dict]:
        if method == "GET" and path == "/registered_model":
            found = [m for m in self.models.values() if m["name"] == query.get("name")]
            return (200, found[0]) if found else (404, _error(404, "no registered model found"))
        if method == "POST" and path == "/registered_models":
            if not body or not body.get("name"):
                return 400, _error(400, "name is required")
            if any(m["name"] == body["name"] for m in self.models.values()):
                return 409, _error(409, f"registered model {body['name']} already exists")
            model = {**body, "id": self._new_id(), "state": "LIVE"}
            self.models[model["id"]] = model
            return 201, model
        if method == "GET" and path == "/model_version":
            found = [
                v
                for v in self.versions.values()
                if v["name"] == query.get("name") and v["registeredModelId"] == query.get("parentResourceId")
            ]
            return (200, found[0]) if found else (404, _error(404, "no model version found"))
        parts = path.strip("/").split("/")
        if parts[0] == "registered_models" and len(parts) == 3 and parts[2] == "versions":
            if parts[1] not in self.models:
                return 404, _error(404, f"no registered model {parts[1]}")
            if method == "GET":
                items = [v for v in self.versions.values() if v["registeredModelId"] == parts[1]]
                return 200, {"items": items, "size": len(items), "pageSize": len(items), "nextPageToken": ""}
            if not body or not body.get("name"):
                return 400, _error(400, "name is required")
            if any(v["name"] == body["name"] and v["registeredModelId"] == parts[1] for v in self.versions.values()):
                return 409, _error(409, f"model version {body['name']} already exists")
            version = {**body, "id": self._new_id(), "registeredModelId": parts[1], "state": "LIVE"}
            self.versions[version["id"]] = version
            return 201, version
        if parts[0] == "model_versions" and len(parts) == 3 and parts[2] == "artifacts":
            if parts[1] not in self.versions:
                return 404, _error(404, f"no model version {parts[1]}")
            if method == "GET":
                items = self.artifacts.get(parts[1], [])
                return 200, {"items": items, "size": len(items), "pageSize": len(items), "nextPageToken": ""}
            artifact = {**(body or {}), "id": self._new_id(), "state": "LIVE"}
            self.artifacts.setdefault(parts[1], []).append(artifact)
            return 201, artifact
        return 404, _error(404, f"no such path {path}")

    def _serve(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        parts = urllib.parse.urlsplit(handler.path)
        query = dict(urllib.parse.parse_qsl(parts.query))
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        if not parts.path.startswith(API):
            return _send(handler, 404, _error(404, "not found"))
        path = parts.path[len(API) :]
        if self.token and handler.headers.get("Authorization") != f"Bearer {self.token}":
            return _send(handler, 401, _error(401, "unauthorized"))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            return _send(handler, 400, _error(400, "invalid JSON"))
        if self.odd and method == self.odd[0] and path.startswith(self.odd[1]):
            self.calls.append((method, path))
            return _send_raw(handler, 200, self.odd[2], self.odd[3])
        with self._lock:
            self.calls.append((method, path))
            status, answer = self._answer(method, path, query, body)
        if self.stall and method == self.stall[0] and path.startswith(self.stall[1]):
            self.stalled.set()  # done, but the caller never hears of it
            self.release.wait(600)
            return
        _send(handler, status, answer)


def _error(status: int, message: str) -> dict:
    return {"code": str(status), "message": message}


def _send(handler: BaseHTTPRequestHandler, status: int, body: dict) -> None:
    _send_raw(handler, status, "application/json", json.dumps(body).encode())


def _send_raw(handler: BaseHTTPRequestHandler, status: int, kind: str, data: bytes) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", kind)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
