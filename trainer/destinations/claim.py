"""Whose a vector database's collection is, decided before anything is written into it: this export's (a
restart resumes into it), absent (made now), or another's (refused in one line unless ``replace``).

Light (no torch, no database client until a database is opened): ``colbert-train`` checks
``vectordb.destination`` at start with :func:`preflight`, before the model is even loaded, and the phase
(``trainer/vectordb.py``) takes the collection with :func:`claim`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from trainer.destinations.base import ExportError
from trainer.destinations.vectors import VectorDatabase, VectorTarget, database, ownership, parse_vector_url

__all__ = ["claim", "preflight"]

log = logging.getLogger("trainer")


def claim(db: VectorDatabase, target: VectorTarget, marker: dict, replace: bool) -> str:
    """The collection made ready for this export: ``created``, ``resumed`` (this export's, from an earlier
    start) or ``replaced``; another's is refused in one line unless ``replace``."""
    found = db.existing()
    if found is False:
        db.create(marker, marker["dim"], replace=False)
        return "created"
    whose = ownership(found, marker)
    if whose == "ours":
        return "resumed"
    if not replace:
        what = (
            "was not made by colbert-k8s" if whose == "foreign" else f"holds another export ({_differs(found, marker)})"
        )
        raise ExportError(
            f"{target}: the {target.container} {target.collection} exists and {what}; name a new "
            f"{target.container}, or replace it (vectordb.replace: true, or --replace)"
        )
    db.create(marker, marker["dim"], replace=True)
    return "replaced"


def _differs(found: dict, want: dict) -> str:
    """What another export's marker names otherwise, in words.

    >>> _differs({"model": "a", "pool_factor": 2}, {"model": "b", "pool_factor": 1})
    'another model, pool_factor 2'
    """
    said = []
    for key in ("model", "corpus", "pool_factor", "dim"):
        if found.get(key) != want.get(key):
            said.append(f"another {key}" if key in ("model", "corpus") else f"{key} {found.get(key)}")
    return ", ".join(said)


def preflight(cfg) -> None:
    """At start: the database answers (the URL and the key hold), and the collection is absent, or this job's
    own from an earlier start (its training finished then: ``final-model/`` is there), or ``replace`` is set.
    Before the job has trained, a collection that exists cannot be its own."""
    if cfg.vectordb is None:
        return
    target = parse_vector_url(cfg.vectordb.destination)
    db = database(target)
    try:
        found = db.existing()
    finally:
        db.close()
    trained = (Path(cfg.output_dir) / "final-model" / "manifest.json").is_file()
    if found is False or cfg.vectordb.replace or (trained and found is not None):
        log.info("vectordb: %s answers; the corpus goes there after training", target)
        return
    what = "was not made by colbert-k8s" if found is None else "holds an export this job did not write"
    raise ExportError(
        f"vectordb.destination {target}: the {target.container} exists and {what}; name a new "
        f"{target.container}, or set vectordb.replace: true to replace it"
    )
