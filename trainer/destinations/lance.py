"""Export the encoded corpus into a LanceDB table (``lancedb:///ABS/PATH?table=NAME``, ``lancedb+s3://...``).

One row per document: ``doc_id``, ``text`` and ``title`` (the corpus row's, null when absent), ``fields`` (the
row's other fields, BEIR's ``metadata`` among them, as one JSON object) and ``vector``, its token vectors as
one multivector column (a list of fixed-size float32 lists). LanceDB compares a multivector query by MaxSim;
with the ``dot`` distance its ``_distance`` is ``query tokens - MaxSim``, so the score is exact MaxSim as PyLate
computes it. Rows are added by ``merge_insert`` on ``doc_id`` (a row whose id is there already is not added
again: a restart writes nothing twice), each call one commit of Lance's (whole or absent). The table's schema
metadata carries the marker (``trainer/destinations/vectors.py``).

An object store's credentials come from the environment as LanceDB's object store reads them
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP``, workload identity; as
``export.destination``'s), never from the URL.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from trainer.destinations.base import ExportError, ExportFailed, reason_of
from trainer.destinations.vectors import MARKER, VectorTarget

__all__ = ["LanceTable"]

T = TypeVar("T")
_COLUMNS = ("text", "title")  # the corpus row's fields that get a column of their own; the rest go to `fields`


class LanceTable:
    """A LanceDB table of multivector rows, in a directory or an object store."""

    def __init__(self, target: VectorTarget):
        try:
            import lancedb
        except ModuleNotFoundError:
            raise ExportError(f"{target}: lancedb is not installed; pip install 'colbert-k8s[vectordb]'") from None
        self.target, self.name = target, target.collection
        self.db = self._call("opening the database", lambda: lancedb.connect(target.location))
        self.table = None

    def existing(self) -> dict | None | bool:
        try:
            self.table = self.db.open_table(self.name)
        except ValueError as e:
            if "not found" in str(e) or "was not found" in str(e):
                return False
            raise ExportFailed(f"{self.target}: opening the table failed ({reason_of(e)})") from None
        except Exception as e:  # the object store's errors: no bucket, a refused credential, no answer
            raise ExportFailed(f"{self.target}: opening the table failed ({reason_of(e)})") from None
        raw = (self.table.schema.metadata or {}).get(MARKER.encode())
        try:
            found = json.loads(raw) if raw else None
        except ValueError:
            return None
        return found if isinstance(found, dict) else None

    def _schema(self, marker: dict, dim: int):
        import pyarrow as pa

        fields = [
            pa.field("doc_id", pa.string(), nullable=False),
            *(pa.field(c, pa.string()) for c in _COLUMNS),
            pa.field("fields", pa.string()),
            pa.field("vector", pa.list_(pa.list_(pa.float32(), dim))),  # (tokens, dim) per row
        ]
        return pa.schema(fields, metadata={MARKER: json.dumps(marker, sort_keys=True)})

    def create(self, marker: dict, dim: int, replace: bool) -> None:
        schema = self._schema(marker, dim)
        mode = "overwrite" if replace else "create"
        self.table = self._call("creating the table", lambda: self.db.create_table(self.name, schema=schema, mode=mode))

    def write(self, ids: list[str], vectors: list[Any], fields: list[dict]) -> int:
        import pyarrow as pa

        schema = self.table.schema
        columns = {
            "doc_id": ids,
            **{c: [_text(f.get(c)) for f in fields] for c in _COLUMNS},
            "fields": [json.dumps({k: v for k, v in f.items() if k not in _COLUMNS}) for f in fields],
            "vector": [v.tolist() for v in vectors],
        }
        rows = pa.table(columns, schema=schema)
        merge = lambda: self.table.merge_insert("doc_id").when_not_matched_insert_all().execute(rows)
        return int(self._call("writing rows", merge).num_inserted_rows)

    def search(self, query: Any, k: int) -> list[tuple[str, float]]:
        ask = self.table.search(query.tolist(), vector_column_name="vector").distance_type("dot").limit(k)
        found = self._call("searching", lambda: ask.select(["doc_id", "_distance"]).to_list())
        return [(row["doc_id"], float(len(query) - row["_distance"])) for row in found]  # _distance = tokens - MaxSim

    def count(self) -> int:
        return int(self._call("counting rows", self.table.count_rows))

    def close(self) -> None:
        self.table = self.db = None

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except ValueError as e:  # LanceDB's refusals: a table that exists, a schema that does not fit
            raise ExportError(f"{self.target}: {what} was refused ({reason_of(e)})") from None
        except Exception as e:  # the object store's: no bucket, a refused credential, no answer
            raise ExportFailed(f"{self.target}: {what} failed ({reason_of(e)})") from None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) or value is None else json.dumps(value)
