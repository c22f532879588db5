"""A vector database as an export destination: its URL, the marker that says which export wrote a collection,
and what the phase (``trainer/vectordb.py``) asks of each database's class.

Standard library only: the config's check of ``vectordb.destination`` and ``colbert-k8s export-index`` read
:func:`parse_vector_url` without the databases' clients. The URL names the database and the collection; it
never holds a credential (a key comes from the environment: ``QDRANT_API_KEY``, ``MILVUS_TOKEN``; an object
store's as the object-store destinations take theirs):

==========================================================  =====================================================
``qdrant://HOST[:PORT]/COLLECTION``                          a Qdrant server over HTTPS (port 6333 by default)
``qdrant+http://HOST[:PORT]/COLLECTION``                     a Qdrant server over plain HTTP (no key may travel)
``qdrant+local:///ABS/PATH?collection=NAME``                 Qdrant's embedded mode, stored under ``/ABS/PATH``
``lancedb:///ABS/PATH?table=NAME``                           a LanceDB database directory
``lancedb+s3://BUCKET/PREFIX?table=NAME`` (gs, az alike)     a LanceDB database in an object store
``milvus://HOST[:PORT]/COLLECTION``                          a Milvus server over TLS (port 19530 by default)
``milvus+http://HOST[:PORT]/COLLECTION``                     a Milvus server without TLS (no token may travel)
``milvus+local:///ABS/PATH.db?collection=NAME``              Milvus Lite, stored under ``/ABS/PATH.db``
==========================================================  =====================================================

>>> str(parse_vector_url("qdrant://qdrant.search:6333/nfcorpus"))
'qdrant://qdrant.search:6333/nfcorpus'
>>> parse_vector_url("lancedb:///data/lance?table=docs").transport
'local'
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any, Literal, Protocol
from urllib.parse import parse_qsl, urlsplit

from trainer.destinations import DESTINATIONS

__all__ = [
    "MARKER",
    "VECTOR_FORMS",
    "VECTOR_PATTERN",
    "VECTOR_SECRETS",
    "VectorDatabase",
    "VectorTarget",
    "database",
    "ownership",
    "parse_vector_url",
]

MARKER = "colbert-k8s"
"""The key of the marker a collection carries (Qdrant's collection metadata, LanceDB's schema metadata,
Milvus's collection properties): which model, pooling and corpus wrote it. A collection without it was not made
by this tool."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VECTOR_SCHEMES = {k: s for k, s in DESTINATIONS.items() if s.kind == "vectors"}

_FORM = {
    "https": "{s}://HOST[:PORT]/{C}",
    "http": "{s}://HOST[:PORT]/{C} (no TLS)",
    "local": "{s}:///ABS/PATH{x}?{c}=NAME",
    "s3": "{s}://BUCKET/PREFIX?{c}=NAME",
}


def _forms() -> str:
    said = []
    for key, scheme in _VECTOR_SCHEMES.items():
        for form, transport in scheme.forms:
            name, c = key + (f"+{form}" if form else ""), scheme.container
            said.append(_FORM.get(transport, _FORM["s3"]).format(s=name, c=c, C=c.upper(), x=scheme.suffix))
    return ", ".join(said)


VECTOR_FORMS = _forms()
"""``vectordb.destination``'s forms, for its description and the refusal of another: every form of every vector
database of the registry, none hand-listed."""
VECTOR_SECRETS = ", ".join(s.secret for s in _VECTOR_SCHEMES.values() if s.secret)
"""The environment variables that hold the vector databases' keys, as the registry names them."""
VECTOR_PATTERN = rf"^({'|'.join(_VECTOR_SCHEMES)})(\+[a-z0-9]+)?://[^@#\s]*$"
"""``vectordb.destination`` as the chart's schema checks it (:func:`parse_vector_url` checks more)."""


@dataclass(frozen=True)
class VectorTarget:
    """A vector database's collection, as a ``vectordb.destination`` URL names it."""

    db: str  # the registry's key: qdrant, lancedb, milvus
    transport: str  # https, http (a server), local (an embedded database), s3, gs, az (an object store)
    collection: str
    host: str = ""  # a server's host, or an object store's bucket
    port: int | None = None
    path: str = ""  # a local database's absolute path, or the prefix in the bucket

    @property
    def container(self) -> str:
        """What the database calls the collection: ``collection`` (Qdrant, Milvus) or ``table`` (LanceDB)."""
        return DESTINATIONS[self.db].container

    @property
    def location(self) -> str:
        """Where the database is, as its client takes it (no credential: none is ever in the URL)."""
        if self.transport in ("https", "http"):
            return f"{self.transport}://{self.host}:{self.port}"
        if self.transport == "local":
            return self.path
        return f"{self.transport}://{self.host}/{self.path}".rstrip("/")

    def __str__(self) -> str:
        scheme = self.db + ("" if self._form == "" else f"+{self._form}")
        if self.transport in ("https", "http"):
            return f"{scheme}://{self.host}:{self.port}/{self.collection}"
        where = self.path if self.transport == "local" else f"{self.host}/{self.path}".rstrip("/")
        return f"{scheme}://{where}?{self.container}={self.collection}"

    @property
    def _form(self) -> str:
        return next(f for f, t in DESTINATIONS[self.db].forms if t == self.transport)


def parse_vector_url(value: str) -> VectorTarget:
    """``vectordb.destination`` checked and split; a ValueError says what is wrong in one line, and never
    repeats a credential it found.

    >>> parse_vector_url("qdrant+local:///tmp/q?collection=docs")
    VectorTarget(db='qdrant', transport='local', collection='docs', host='', port=None, path='/tmp/q')
    >>> parse_vector_url("qdrant://key:secret@host/docs")
    Traceback (most recent call last):
    ...
    ValueError: holds credentials (not shown); a vector database's key comes from the environment: QDRANT_API_KEY
    """
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as e:
        raise ValueError(f"is not a valid URL ({e})") from None
    db, _, form = parts.scheme.partition("+")
    scheme = _VECTOR_SCHEMES.get(db)
    if parts.username or parts.password or "@" in parts.netloc:
        secret = scheme.secret if scheme and scheme.secret else "--secret-env VAR=SECRET/KEY"
        raise ValueError(f"holds credentials (not shown); a vector database's key comes from the environment: {secret}")
    if scheme is None or form not in dict(scheme.forms):
        shown = f"{parts.scheme}://" if parts.scheme else "a path"
        raise ValueError(f"{shown} is not a vector database destination; use {VECTOR_FORMS}")
    transport = dict(scheme.forms)[form]
    if parts.fragment:
        raise ValueError("has a fragment (#...); remove it")
    query = _query(parts.query, scheme.container)
    if transport in ("https", "http"):
        return _server(db, transport, parts, port, query)
    name = query.get(scheme.container, "")
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"names no {scheme.container}: add ?{scheme.container}=NAME (letters, digits, '_', '-', '.'; at most 128)"
        )
    _identifier(db, name)
    if transport == "local":
        where = f"{parts.scheme}:///ABS/PATH{scheme.suffix}?{scheme.container}=NAME"
        if parts.netloc or not parts.path.startswith("/"):
            raise ValueError(f"needs an absolute path: {where}")
        _plain(parts.path)
        path = parts.path.rstrip("/") or "/"
        if scheme.suffix and (not path.endswith(scheme.suffix) or path.rsplit("/", 1)[-1] == scheme.suffix):
            raise ValueError(f"needs a path ending in {scheme.suffix}: {where}")
        return VectorTarget(db, transport, name, path=path)
    if not parts.netloc:
        raise ValueError(f"{parts.scheme}:// names no bucket")
    prefix = parts.path.strip("/")
    _plain(prefix)
    return VectorTarget(db, transport, name, host=parts.netloc, path=prefix)


def _query(text: str, container: str) -> dict[str, str]:
    """The URL's query: only ``container=NAME``; any other key is refused by name, its value never shown."""
    try:
        pairs = parse_qsl(text, keep_blank_values=True, strict_parsing=bool(text))
    except ValueError:
        raise ValueError(f"has a query that does not parse; give ?{container}=NAME alone") from None
    for key, _ in pairs:
        if key != container:
            shown = key if key.isidentifier() and len(key) <= 40 else "a key"
            raise ValueError(
                f"takes no {shown} in its query (only ?{container}=NAME); a key comes from the environment"
            )
    return dict(pairs)


def _identifier(db: str, name: str) -> None:
    """A database whose collection names are identifiers (Milvus) refuses another name here, not at its server."""
    if DESTINATIONS[db].identifier and not _IDENTIFIER.fullmatch(name):
        raise ValueError(
            f"names the {DESTINATIONS[db].container} {name!r}: {db} takes letters, digits and '_' only, not a "
            "digit first"
        )


def _plain(path: str) -> None:
    if any(p in (".", "..") for p in path.split("/")):
        raise ValueError("the path holds '.' or '..'; give a plain path")


def _server(db: str, transport: str, parts, port: int | None, query: dict) -> VectorTarget:
    container = DESTINATIONS[db].container
    if query:
        raise ValueError(f"names the {container} in its path: {parts.scheme}://HOST[:PORT]/{container.upper()}")
    if not parts.hostname:
        raise ValueError(f"{parts.scheme}:// names no host")
    names = [n for n in parts.path.split("/") if n]
    if len(names) != 1 or not _NAME.fullmatch(names[0]):
        raise ValueError(
            f"must name one {container}: {parts.scheme}://HOST[:PORT]/{container.upper()} (letters, digits, '_', "
            "'-', '.')"
        )
    _identifier(db, names[0])
    return VectorTarget(db, transport, names[0], host=parts.hostname, port=port or DESTINATIONS[db].port)


def ownership(found: dict | None, want: dict) -> Literal["ours", "another export", "foreign"]:
    """Whose a collection is, by the marker it carries: ``ours`` (this model, pooling and corpus: a restart
    resumes into it), ``another export`` (this tool's, of another model, pooling or corpus) or ``foreign``
    (no marker: not made by this tool).

    >>> ownership({"model": "a", "corpus": "c", "pool_factor": 1, "dim": 8}, {"model": "a", "corpus": "c",
    ...           "pool_factor": 1, "dim": 8})
    'ours'
    >>> ownership(None, {"model": "a"}), ownership({"model": "b"}, {"model": "a"})
    ('foreign', 'another export')
    """
    if not isinstance(found, dict):
        return "foreign"
    keys = ("model", "corpus", "pool_factor", "dim")
    return "ours" if all(found.get(k) == want.get(k) for k in keys) else "another export"


class VectorDatabase(Protocol):
    """What ``trainer/vectordb.py`` asks of a vector database's class (one per database)."""

    def __init__(self, target: VectorTarget) -> None: ...

    def existing(self) -> dict | None | Literal[False]:
        """The marker of the collection the URL names: False when there is none; None when it exists without
        one. Reaching the database proves the URL and the key (a refusal is one line)."""

    def create(self, marker: dict, dim: int, replace: bool) -> None:
        """The collection made anew, carrying ``marker`` (with ``replace``: an existing one dropped first)."""

    def write(self, ids: list[str], vectors: list[Any], fields: list[dict]) -> int:
        """The documents not already there written (each its id, its token vectors and its other fields);
        returns how many were written. Writing the same ids again adds nothing."""

    def search(self, query: Any, k: int) -> list[tuple[str, float]]:
        """The top ``k`` (document id, MaxSim score) of one query's token vectors, best first."""

    def count(self) -> int:
        """The points the collection holds (Milvus: its rows, one per token vector)."""

    def close(self) -> None:
        """Release the client (an embedded database's lock)."""


def database(target: VectorTarget) -> VectorDatabase:
    """The class of ``target``'s database (its client imported now: qdrant-client, lancedb, pymilvus), opened on
    it."""
    module, name = DESTINATIONS[target.db].cls.split(":")
    return getattr(importlib.import_module(f"trainer.destinations.{module}"), name)(target)
