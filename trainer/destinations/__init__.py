"""Export destinations: every place a trained model, or its encoded corpus, can be exported to, by URL scheme.

This module is light (standard library only): the config's URL checks (``trainer/config/base.py``,
``trainer/destinations/vectors.py``), the chart's pattern, ``colbert-k8s submit``'s "these credentials are
missing" line and the chart's credential helper all read :data:`DESTINATIONS`. Each :class:`Scheme` names its
class, imported only when an export runs (:func:`uploader`, :func:`trainer.destinations.vectors.database`).
A ``files`` scheme takes the model's files (``export.destination``); a ``vectors`` scheme is a vector
database that takes the corpus encoded by the model, one multi-vector point per document
(``vectordb.destination``, ``colbert-k8s export-index``):

=======  =======  ===========  ========================================================================
key      kind     layout       class
=======  =======  ===========  ========================================================================
s3       files    BUCKET/PFX/  an object store through obstore: probe object, resumable journal, manifest last
gs       files    BUCKET/PFX/  the same
az       files    BUCKET/PFX/  the same (the container is the bucket)
hf       files    ORG/NAME     a Hugging Face Hub model repository: write probe, one commit, manifest included
qdrant   vectors  HOST/COLL    Qdrant (qdrant-client; ``qdrant+local://`` its embedded mode): MAX_SIM multivectors
lancedb  vectors  PATH?table=  LanceDB (a directory, or ``lancedb+s3://``): a multivector column, dot MaxSim
milvus   vectors  HOST/COLL    Milvus (pymilvus; ``milvus+local://`` Milvus Lite): a row per token, MaxSim rescoring
=======  =======  ===========  ========================================================================

An uploader (:class:`Uploader`) has ``preflight(cfg, dest, hint)`` (at start: the destination takes a write)
and ``upload(cfg, dest, plan, manifest, done)`` (manifest last); a vector database's class is
:class:`trainer.destinations.vectors.VectorDatabase`. A new destination is one module and one line here.

>>> {"s3", "gs", "az", "hf"} <= set(DESTINATIONS)
True
>>> [k for k, s in DESTINATIONS.items() if s.hub]
['hf']
>>> [k for k, s in DESTINATIONS.items() if s.kind == "vectors"]
['qdrant', 'lancedb', 'milvus']
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

__all__ = ["CREDENTIALS", "DESTINATIONS", "FILE_SCHEMES", "Scheme", "Uploader", "credential_hint", "uploader"]


@dataclass(frozen=True)
class Scheme:
    """A destination's URL scheme, the credentials its client reads from the environment, and its uploader."""

    key: str
    credentials: tuple[tuple[str, ...], ...]
    """Sets of environment variables, any one set enough. Where none is set, an object store's client falls
    back to the node's identity (instance metadata, EKS/GKE/AKS workload identity); the Hub has none.
    ``()``: the destination needs no credential (a mounted directory), so nothing is ever missing."""
    cls: str  # "module:Class" under trainer.destinations, imported when an export runs
    hub: bool = False
    """A Hub model repository (``ORG/NAME``, with ``export.revision``, ``private`` and ``replace``), not
    ``BUCKET/PREFIX/``."""
    needs: str = "needs credentials"  # the missing-credentials line's words
    kind: Literal["files", "vectors"] = "files"
    """``files``: ``export.destination`` (the model's files); ``vectors``: a vector database
    (``vectordb.destination``), whose URL forms are ``forms``."""
    forms: tuple[tuple[str, str], ...] = ()
    """A vector database's URL forms: (what follows ``KEY+`` in the scheme, the transport it means); ``""`` is
    the bare ``KEY://``. Transports: ``https``/``http`` (a server), ``local`` (an embedded database at an
    absolute path), ``s3``/``gs``/``az`` (a database in an object store)."""
    container: str = "collection"  # what the database calls the set of points a URL names
    secret: str | None = None
    """The environment variable that holds a vector database's key, if it takes one (optional: a server
    without authentication takes none); read from the environment only, never from the URL."""
    port: int | None = None  # a vector database server's port when the URL names none
    suffix: str = ""  # what a local database's path must end with (Milvus Lite opens a path ending in .db)
    identifier: bool = False  # the collection's name takes letters, digits and '_' only, not a digit first

    def hint(self, env: Collection[str]) -> tuple[str, str] | None:
        """(what is missing, the flags that pass it) when ``env`` holds none of the credential sets; else None.

        >>> Scheme("file", (), "local:Directory").hint(set()) is None  # a credential-free scheme misses nothing
        True
        """
        if not self.credentials or any(all(var in env for var in one) for one in self.credentials):
            return None
        return self.needs, " and ".join(f"--secret-env {v}=SECRET/KEY" for v in self.credentials[0])


DESTINATIONS: dict[str, Scheme] = {
    s.key: s
    for s in (
        Scheme(
            "s3",
            (
                ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
                ("AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"),  # EKS IRSA
                ("AWS_CONTAINER_CREDENTIALS_FULL_URI",),  # EKS Pod Identity
            ),
            "store:ObjectStore",
        ),
        # GOOGLE_SERVICE_ACCOUNT_KEY holds the key's JSON (a Secret's value); the other two name a mounted file
        Scheme(
            "gs",
            (("GOOGLE_SERVICE_ACCOUNT_KEY",), ("GOOGLE_APPLICATION_CREDENTIALS",), ("GOOGLE_SERVICE_ACCOUNT",)),
            "store:ObjectStore",
        ),
        Scheme(
            "az",
            (
                ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY"),
                ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_SAS_KEY"),
                ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET"),
                ("AZURE_FEDERATED_TOKEN_FILE",),  # AKS workload identity
            ),
            "store:ObjectStore",
        ),
        Scheme(
            "hf", (("HF_TOKEN",),), "hub:HubRepository", hub=True, needs="needs HF_TOKEN (a token with write access)"
        ),
        Scheme(
            "qdrant",
            (),
            "qdrant:QdrantCollection",
            kind="vectors",
            forms=(("", "https"), ("http", "http"), ("local", "local")),
            secret="QDRANT_API_KEY",
            port=6333,
        ),
        Scheme(
            "lancedb",
            (),
            "lance:LanceTable",
            kind="vectors",
            forms=(("", "local"), ("s3", "s3"), ("gs", "gs"), ("az", "az")),
            container="table",
        ),
        Scheme(
            "milvus",
            (),
            "milvus:MilvusCollection",
            kind="vectors",
            forms=(("", "https"), ("http", "http"), ("local", "local")),
            secret="MILVUS_TOKEN",
            port=19530,
            suffix=".db",
            identifier=True,
        ),
    )
}

FILE_SCHEMES = tuple(k for k, s in DESTINATIONS.items() if s.kind == "files")
"""The schemes ``export.destination`` takes (the model's files)."""
CREDENTIALS = {key: DESTINATIONS[key].credentials for key in FILE_SCHEMES}
"""Each ``export.destination`` scheme's credential sets, as the chart's helper lists them
(``tests/test_chart_usage.py``)."""


class _Where(Protocol):
    scheme: str


def credential_hint(dest: _Where, env: Collection[str]) -> tuple[str, str] | None:
    """(what is missing, the flags that pass it) when the environment holds none of the destination's
    credential sets; else None.

    >>> from trainer.config.base import parse_destination
    >>> credential_hint(parse_destination("hf://org/m"), {})
    ('needs HF_TOKEN (a token with write access)', '--secret-env HF_TOKEN=SECRET/KEY')
    >>> credential_hint(parse_destination("s3://b/p"), {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}) is None
    True
    """
    return DESTINATIONS[dest.scheme].hint(env)


class Uploader(Protocol):
    """What ``trainer/storage/export.py`` asks of a destination's uploader."""

    def preflight(self, cfg: Any, dest: Any, hint: str | None) -> None:
        """At start: the destination takes a write (``hint``: the missing-credentials line, if any)."""

    def upload(
        self, cfg: Any, dest: Any, plan: dict[str, Path], manifest: dict, done: Callable[[], None]
    ) -> int | None:
        """The files of ``plan``, then the manifest; the bytes sent (None: not counted). ``done()`` per step."""

    def steps(self, plan: dict[str, Path]) -> int:
        """How many times :meth:`upload` calls ``done()``, for the job's progress."""


def uploader(dest: _Where) -> Uploader:
    """The uploader of ``dest``'s scheme (its module imported now: obstore, huggingface_hub)."""
    module, name = DESTINATIONS[dest.scheme].cls.split(":")
    return getattr(importlib.import_module(f"trainer.destinations.{module}"), name)()
