"""Export the encoded corpus into a Milvus collection (``milvus://``, ``milvus+http://``, ``milvus+local://``).

One row per token vector, as Milvus's own ColBERT tutorial stores a multi-vector document: ``id`` (Milvus's auto
id), ``doc_id``, ``token`` (the vector's place in its document), ``fields`` (JSON: the corpus row's other fields,
``text``, ``title``, ``metadata``, ..., on the document's first row; ``{}`` on the others) and ``vector`` (a
FLOAT_VECTOR of the model's dimension, under an ``AUTOINDEX`` of inner product). Milvus's embedding lists (a
document per row, ``MAX_SIM`` over an array of structs) are not used: Milvus Lite refuses that schema, and this
one is the same on Milvus Lite and on every Milvus server.

**Search** is ColBERT's two stages. Each query token's :data:`TOKEN_HITS` nearest token vectors (the index's
approximate search) name the candidate documents; every token vector of each candidate is read back (a filter
on ``doc_id``) and the candidate scored by exact MaxSim; the best ``k`` are returned with those exact scores. A
document none of whose vectors is among any query token's nearest is never a candidate: the ranking is
approximate by construction, and the export's check against exact MaxSim (``trainer/vectordb.py``) says by how
much.

**Written once.** Before a chunk is written its documents' rows are counted: a document with all its rows is
skipped, and one with only some (a write cut short) has them deleted and is written again whole, so a restart
writes no row twice.

**The marker** is the collection property ``colbert-k8s`` (JSON): Milvus Lite keeps a collection's properties
but not its description. A server that keeps no property is refused in one line.

**Keys.** ``MILVUS_TOKEN`` (the environment, never the URL: ``USER:PASSWORD`` or an API key) goes over gRPC to the
named server only (gRPC follows no redirect), and never over plain ``milvus+http://``. ``milvus+local://`` is
Milvus Lite (``MilvusClient("/ABS/PATH.db")``): the same calls, served in this process, one process at a time.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from trainer.destinations import DESTINATIONS
from trainer.destinations.base import ExportError, ExportFailed, reason_of
from trainer.destinations.vectors import MARKER, VectorTarget

__all__ = ["TOKEN_HITS", "MilvusCollection"]

KEY = DESTINATIONS["milvus"].secret  # MILVUS_TOKEN
TOKEN_HITS = 64
"""Token vectors each query token asks the index for (k/2 where larger). ColBERT's end-to-end retrieval (Khattab
and Zaharia, 2020, section 3.6) takes each query token's k/2 nearest for a top k = 1000; for a top 10 that would be
5, too few to find a document that matches many query tokens moderately. 64 gives a 32-token query up to 2,048
candidates, and bounds what the exact rescoring reads back."""
_FLOATS_PER_REQUEST = 1 << 19  # about 2 MB of float32 an insert (a few MB of protobuf): a small gRPC message
_IDS_PER_FILTER = 256  # document ids in one `doc_id in [...]` filter: an expression of a few kilobytes
_BYTES_PER_READ = 4 << 20  # rows read back per request, as bytes of vectors
_TIMEOUT = 60.0  # seconds a call (and the connection) may take
_COUNT = ["count(*)"]
T = TypeVar("T")


def _quiet() -> None:
    """pymilvus logs every refused call with its traceback on a handler of its own, and Milvus Lite a lock held by
    another process; here each becomes one line (:meth:`MilvusCollection._call`), so their loggers say nothing."""
    for name in ("pymilvus", "pymilvus.milvus_client", "milvus_lite"):
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)


def _literal(text: str) -> str:
    """``text`` as a string literal of a Milvus filter (the escapes both Milvus and Milvus Lite read).

    >>> _literal('a"b\\\\c')
    '"a\\\\"b\\\\\\\\c"'
    """
    if any(ord(c) < 0x20 and c not in "\n\r\t" for c in text):
        raise ExportError(f"document id {text[:80]!r} holds a control character; Milvus cannot filter on it")
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return '"' + escaped.replace("\t", "\\t") + '"'


def _in(ids: list[str]) -> str:
    return "doc_id in [" + ", ".join(_literal(i) for i in ids) + "]"


class MilvusCollection:
    """A Milvus collection of token-vector rows, on a server or in Milvus Lite."""

    def __init__(self, target: VectorTarget):
        try:
            from pymilvus import MilvusClient
        except ModuleNotFoundError:
            raise ExportError(f"{target}: pymilvus is not installed; pip install 'colbert-k8s[vectordb]'") from None
        _quiet()
        self.target, self.name = target, target.collection
        self._loaded = False
        self._dim = 0
        key = os.environ.get(KEY) or None
        if target.transport == "local":
            self.client = self._call("opening Milvus Lite", MilvusClient, target.path, timeout=_TIMEOUT)
            return
        if key and target.transport == "http":
            raise ExportError(
                f"{target}: {KEY} would travel in clear over plain HTTP; use milvus:// (TLS), or unset it"
            )
        self.client = self._call("connecting", MilvusClient, uri=target.location, token=key or "", timeout=_TIMEOUT)

    def existing(self) -> dict | None | bool:
        if not self._call("listing collections", self.client.has_collection, self.name, timeout=_TIMEOUT):
            return False
        info = self._call("reading the collection", self.client.describe_collection, self.name, timeout=_TIMEOUT)
        vector = next((f for f in info.get("fields", []) if f.get("name") == "vector"), {})
        self._dim = int((vector.get("params") or {}).get("dim") or 0)
        try:
            found = json.loads((info.get("properties") or {}).get(MARKER) or "null")
        except ValueError:
            return None
        return found if isinstance(found, dict) else None

    def create(self, marker: dict, dim: int, replace: bool) -> None:
        from pymilvus import DataType, MilvusClient

        if replace:
            self._call("removing the collection", self.client.drop_collection, self.name, timeout=_TIMEOUT)
        schema = MilvusClient.create_schema(auto_id=True, enable_dynamic_field=False)
        schema.add_field("id", DataType.INT64, is_primary=True)
        schema.add_field("doc_id", DataType.VARCHAR, max_length=65535)
        schema.add_field("token", DataType.INT32)
        schema.add_field("fields", DataType.JSON)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
        index = self.client.prepare_index_params()
        index.add_index(field_name="vector", index_type="AUTOINDEX", metric_type="IP")
        self._call(
            "creating the collection",
            self.client.create_collection,
            self.name,
            schema=schema,
            index_params=index,
            consistency_level="Strong",  # a restart's count of the rows written sees every one
            properties={MARKER: json.dumps(marker, sort_keys=True)},
            timeout=_TIMEOUT,
        )
        if self.existing() != marker:
            raise ExportError(
                f"{self.target}: the server keeps no collection properties, where the export's marker goes; use a "
                "Milvus server that keeps them"
            )
        self._loaded = False

    def write(self, ids: list[str], vectors: list[Any], fields: list[dict]) -> int:
        self._load()
        have = self._rows(ids)
        whole = {d for d, v in zip(ids, vectors) if have.get(d) == len(v)}
        cut = [d for d in ids if d in have and d not in whole]  # a write cut short, or rows written twice
        for some in _batches(cut, _IDS_PER_FILTER):
            self._call("removing partial documents", self.client.delete, self.name, filter=_in(some), timeout=_TIMEOUT)
        rows: list[dict] = []
        written = floats = 0
        for doc, vec, extra in zip(ids, vectors, fields):
            if doc in whole:
                continue
            written += 1
            for t, v in enumerate(np.asarray(vec, dtype=np.float32)):  # (tokens, dim) -> a row per token
                rows.append({"doc_id": doc, "token": t, "fields": extra if t == 0 else {}, "vector": v.tolist()})
                floats += v.size
                if floats >= _FLOATS_PER_REQUEST:
                    self._insert(rows)
                    rows, floats = [], 0
        if rows:
            self._insert(rows)
        return written

    def _insert(self, rows: list[dict]) -> None:
        self._call("writing rows", self.client.insert, self.name, rows, timeout=_TIMEOUT)

    def _rows(self, ids: list[str]) -> dict[str, int]:
        """How many rows each of ``ids`` has (absent: none); one count when none has any, as on a first write."""
        have: Counter[str] = Counter()
        for some in _batches(ids, _IDS_PER_FILTER):
            found = self._call("counting rows", self.client.query, self.name, filter=_in(some), output_fields=_COUNT)
            if found[0]["count(*)"]:
                have.update(r["doc_id"] for r in self._read(some, ["doc_id"]))
        return dict(have)

    def _read(self, ids: list[str], fields: list[str]) -> Iterator[dict]:
        """The rows of ``ids`` with ``fields``, through pymilvus's query iterator (any number of rows)."""
        batch = max(1, min(16384, _BYTES_PER_READ // (4 * max(self._dim, 1))))
        rows = self._call(
            "reading rows", self.client.query_iterator, self.name, batch, filter=_in(ids), output_fields=fields
        )
        try:
            while page := self._call("reading rows", rows.next):
                yield from page
        finally:
            rows.close()

    def search(self, query: Any, k: int) -> list[tuple[str, float]]:
        import torch

        from trainer.retrieval.exact import maxsim

        self._load()
        query = np.asarray(query, dtype=np.float32)  # (query tokens, dim)
        hits = self._call(
            "searching",
            self.client.search,
            self.name,
            data=query.tolist(),  # each query token searched on its own: its nearest token vectors
            anns_field="vector",
            limit=max(TOKEN_HITS, k // 2),
            output_fields=["doc_id"],
            search_params={"metric_type": "IP"},
            timeout=_TIMEOUT,
        )
        candidates = sorted({h["entity"]["doc_id"] for per_token in hits for h in per_token})
        tokens: dict[str, list] = {d: [] for d in candidates}
        for some in _batches(candidates, _IDS_PER_FILTER):
            for row in self._read(some, ["doc_id", "vector"]):
                tokens[row["doc_id"]].append(row["vector"])
        if not candidates:
            return []
        scores = maxsim(
            torch.as_tensor(query)[None], [torch.as_tensor(np.asarray(tokens[d], np.float32)) for d in candidates]
        )
        ranked = sorted(zip(candidates, scores[0].tolist()), key=lambda s: (-s[1], s[0]))
        return ranked[:k]  # exact MaxSim (PyLate's) over each candidate's own tokens

    def count(self) -> int:
        self._load()
        found = self._call("counting rows", self.client.query, self.name, output_fields=_COUNT, timeout=_TIMEOUT)
        return int(found[0]["count(*)"])

    def close(self) -> None:
        self.client.close()
        if self.target.transport == "local":  # Milvus Lite serves the file until told: its lock goes with it
            from milvus_lite.server_manager import server_manager_instance

            server_manager_instance.release_server(self.target.path)

    def _load(self) -> None:
        """The collection loaded for reading, once (Milvus Lite opens an existing collection released)."""
        if not self._loaded:
            if not self._dim:
                self.existing()
            self._call("loading the collection", self.client.load_collection, self.name, timeout=_TIMEOUT)
            self._loaded = True

    def _call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One client call; what went wrong is one line: a refusal (a token, a name, Milvus Lite open elsewhere)
        is :class:`ExportError`, a server that does not answer or fails is :class:`ExportFailed`."""
        import grpc
        from pymilvus.exceptions import MilvusException

        try:
            return fn(*args, **kwargs)
        except grpc.RpcError as e:  # the calls pymilvus does not retry: a token refused, a deadline
            raise _rpc_refusal(self.target, what, e) from None
        except MilvusException as e:
            if isinstance(e.__cause__, grpc.RpcError):  # pymilvus's "Fail connecting" over the server's own answer
                said = _rpc_refusal(self.target, what, e.__cause__)
                if isinstance(said, ExportError):
                    raise said from None
            raise _refusal(self.target, what, e) from None
        except (OSError, ValueError, TypeError) as e:
            raise ExportFailed(f"{self.target}: {what} failed ({reason_of(e)})") from None


def _batches(items: list[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _said(message: str) -> str:
    """A server's message, its first line only, and never the token."""
    first = (message or "").strip().splitlines()[0][:200] if (message or "").strip() else "no reason given"
    key = os.environ.get(KEY)
    return first.replace(key, "(not shown)") if key else first


def _lock_held(path: str) -> bool:
    """Whether another process holds Milvus Lite's lock on ``path`` (its ``LOCK`` file, taken with flock)."""
    lock = Path(path) / "LOCK"
    if not lock.is_file():
        return False
    with lock.open("rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


def _token_line(target: VectorTarget, what: str, how: str) -> ExportError:
    given = f"{KEY} was refused" if os.environ.get(KEY) else f"it needs {KEY}"
    return ExportError(
        f"{target}: the server refused {what} ({how}): {given}; pass a valid token with --secret-env {KEY}=SECRET/KEY"
    )


def _rpc_refusal(target: VectorTarget, what: str, e) -> Exception:
    import grpc

    code = e.code() if callable(getattr(e, "code", None)) else None
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return _token_line(target, what, code.name)
    name = code.name if code is not None else "no status"
    details = _said(e.details() if callable(getattr(e, "details", None)) else "")
    return ExportFailed(f"{target}: {what} failed ({name}: {details}); a restart retries")


def _refusal(target: VectorTarget, what: str, e) -> Exception:
    """A Milvus error as one line: who is to blame and the fix."""
    message = _said(e.message)
    lowered = message.lower()
    if target.transport == "local" and "open local milvus failed" in lowered:
        parent = str(Path(target.path).parent)
        if not Path(parent).is_dir():
            return ExportError(f"{target}: the directory {parent} does not exist; create it, or name another path")
        if _lock_held(target.path):
            return ExportError(
                f"{target}: {target.path} is open in another process; Milvus Lite takes one at a time (close it, or "
                "use a Milvus server)"
            )
        return ExportFailed(f"{target}: opening Milvus Lite at {target.path} failed")
    if "fail connecting" in lowered or "unavailable" in lowered or "deadline" in lowered:
        return ExportFailed(f"{target}: the server cannot be reached ({message}); a restart retries")
    if any(w in lowered for w in ("auth", "credential", "privilege", "permission")):
        return _token_line(target, what, message)
    code = int(e.code) if isinstance(e.code, int) else 0
    if code in (1, 2, 5, 8, 9) or "rate limit" in lowered:  # not ready, unavailable, internal, rate limited
        return ExportFailed(f"{target}: the server answered code {code} at {what} ({message}); a restart retries")
    return ExportError(f"{target}: the server refused {what} (code {code}: {message})")
