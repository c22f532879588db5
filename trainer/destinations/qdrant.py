"""Export the encoded corpus into a Qdrant collection (``qdrant://``, ``qdrant+http://``, ``qdrant+local://``).

One point per document: its token vectors as one multivector compared by ``MAX_SIM`` over the dot product
(exact MaxSim, as PyLate scores), its id ``uuid5(NAMESPACE, document id)`` (so a restart writes the same
points, and a user finds a document's point from its id), and a payload of ``doc_id`` and the corpus row's
other fields. The collection's metadata carries the marker (``trainer/destinations/vectors.py``); Qdrant keeps
collection metadata from 1.16 on, and an older server is refused in one line.

The server form talks REST through qdrant-client's httpx client, which follows no redirect; ``QDRANT_API_KEY``
(the environment, never the URL) goes to the named host only, and never over plain HTTP. ``qdrant+local://`` is
qdrant-client's embedded mode (``QdrantClient(path=...)``): the same calls, no server, one process at a time.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from trainer.destinations import DESTINATIONS
from trainer.destinations.base import ExportError, ExportFailed, reason_of
from trainer.destinations.vectors import MARKER, VectorTarget

__all__ = ["NAMESPACE", "QdrantCollection", "point_id"]

log = logging.getLogger("trainer")

NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/colbert-k8s/colbert-k8s/vectordb")
"""The namespace of the points' ids: a document's point is ``uuid5(NAMESPACE, document id)``."""
KEY = DESTINATIONS["qdrant"].secret  # QDRANT_API_KEY
_FLOATS_PER_REQUEST = 1 << 19  # about 5 MB of JSON a request: far below a server's 32 MB default limit
T = TypeVar("T")


def point_id(doc_id: str) -> str:
    """The point a document is written as: the same for the same id, on every run.

    >>> point_id("doc-1") == point_id("doc-1") != point_id("doc-2")
    True
    """
    return str(uuid.uuid5(NAMESPACE, doc_id))


class QdrantCollection:
    """A Qdrant collection of multivector points, on a server or embedded."""

    def __init__(self, target: VectorTarget):
        try:
            from qdrant_client import QdrantClient
        except ModuleNotFoundError:
            raise ExportError(
                f"{target}: qdrant-client is not installed; pip install 'colbert-k8s[vectordb]'"
            ) from None
        self.target, self.name = target, target.collection
        key = os.environ.get(KEY) or None
        if target.transport == "local":
            self.client = self._call("opening the embedded database", lambda: QdrantClient(path=target.path))
            return
        if key and target.transport == "http":
            raise ExportError(
                f"{target}: {KEY} would travel in clear over plain HTTP; use qdrant:// (TLS), or unset it"
            )
        self.client = QdrantClient(
            url=target.location, api_key=key, timeout=60, prefer_grpc=False, check_compatibility=False
        )

    def existing(self) -> dict | None | bool:
        if not self._call("listing collections", lambda: self.client.collection_exists(self.name)):
            return False
        info = self._call("reading the collection", lambda: self.client.get_collection(self.name))
        found = (getattr(info.config, "metadata", None) or {}).get(MARKER)
        return found if isinstance(found, dict) else None

    def create(self, marker: dict, dim: int, replace: bool) -> None:
        from qdrant_client import models

        if replace:
            self._call("removing the collection", lambda: self.client.delete_collection(self.name))
        config = models.VectorParams(
            size=dim,
            distance=models.Distance.DOT,
            multivector_config=models.MultiVectorConfig(comparator=models.MultiVectorComparator.MAX_SIM),
        )
        create = lambda: self.client.create_collection(self.name, vectors_config=config, metadata={MARKER: marker})
        self._call("creating the collection", create)
        if self.existing() != marker:
            raise ExportError(
                f"{self.target}: the server keeps no collection metadata, where the export's marker goes; "
                "use Qdrant 1.16 or newer"
            )

    def write(self, ids: list[str], vectors: list[Any], fields: list[dict]) -> int:
        from qdrant_client import models

        points = [point_id(i) for i in ids]
        have = self._call(
            "reading which points exist",
            lambda: self.client.retrieve(self.name, ids=points, with_payload=False, with_vectors=False),
        )
        present = {str(p.id) for p in have}
        batch: list = []
        floats = written = 0
        for doc, pid, vec, extra in zip(ids, points, vectors, fields):
            if pid in present:
                continue
            batch.append(models.PointStruct(id=pid, vector=vec.tolist(), payload={**extra, "doc_id": doc}))
            floats += vec.size
            if floats >= _FLOATS_PER_REQUEST:
                written += self._upsert(batch)
                batch, floats = [], 0
        return written + (self._upsert(batch) if batch else 0)

    def _upsert(self, batch: list) -> int:
        self._call("writing points", lambda: self.client.upsert(self.name, points=batch, wait=True))
        return len(batch)

    def search(self, query: Any, k: int) -> list[tuple[str, float]]:
        found = self._call(
            "searching",
            lambda: self.client.query_points(self.name, query=query.tolist(), limit=k, with_payload=["doc_id"]),
        )
        return [(p.payload["doc_id"], float(p.score)) for p in found.points]

    def count(self) -> int:
        return self._call("counting points", lambda: self.client.count(self.name, exact=True)).count

    def close(self) -> None:
        self.client.close()

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """One client call; what went wrong is one line: a refusal (a key, a redirect, a locked embedded
        database) is :class:`ExportError`, a server that does not answer or fails is :class:`ExportFailed`."""
        from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

        try:
            return fn()
        except UnexpectedResponse as e:
            raise _refusal(self.target, what, e) from None
        except ResponseHandlingException as e:
            raise ExportFailed(f"{self.target}: the server cannot be reached ({reason_of(e.source)})") from None
        except RuntimeError as e:
            if "already accessed" in str(e):  # the embedded mode's lock: another process has it open
                raise ExportError(
                    f"{self.target}: {self.target.path} is open in another process; the embedded mode takes one "
                    "at a time (close it, or use a Qdrant server)"
                ) from None
            raise ExportFailed(f"{self.target}: {what} failed ({reason_of(e)})") from None
        except (OSError, ValueError) as e:
            raise ExportFailed(f"{self.target}: {what} failed ({reason_of(e)})") from None


def _refusal(target: VectorTarget, what: str, e) -> Exception:
    """A server's answer other than success, as one line: who is to blame and the fix."""
    status = e.status_code or 0
    if status in (401, 403):
        given = f"{KEY} was refused" if os.environ.get(KEY) else f"it needs {KEY}"
        return ExportError(
            f"{target}: the server answered HTTP {status} at {what}: {given}; pass a valid key with "
            f"--secret-env {KEY}=SECRET/KEY"
        )
    if 300 <= status < 400:
        where = e.headers.get("location", "elsewhere") if e.headers is not None else "elsewhere"
        return ExportError(
            f"{target}: the server answered a redirect (HTTP {status} to {where[:120]}) at {what}; no redirect is "
            "followed: give the server's own address"
        )
    first = (e.content or b"").decode("utf-8", "replace").strip().splitlines()
    said = f"HTTP {status} {e.reason_phrase}" + (f": {first[0][:160]}" if first else "")
    if status == 429 or status >= 500:
        return ExportFailed(f"{target}: the server answered {said} at {what}; a restart retries")
    return ExportError(f"{target}: the server refused {what} ({said})")
