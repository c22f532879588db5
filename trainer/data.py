"""Training data: load rows, check every one, tokenise once, and cut deterministic global batches.

A batch is a pure function of (seed, step): step ``s`` of epoch ``e`` takes the ``s``-th slice of
``global_batch`` indices from the epoch's seeded permutation, and rank ``r`` takes the ``r``-th
``per_device`` part of it. Resuming therefore needs only the step, every rank gets an equal batch
(the tail that would not fill a global batch is dropped), and one process with batch ``W*b`` sees
exactly the examples that ``W`` ranks with batch ``b`` see together.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from trainer.config import ConfigError, DataSource

__all__ = ["DataError", "Rows", "load_rows", "TokenizedData", "Batch"]


class DataError(ConfigError):
    """Bad training data; the message names the file, the row and the column."""


@dataclass
class Rows:
    """Validated training rows: a query, its documents (positive first) and optional teacher scores."""

    queries: list[str]
    documents: list[list[str]]
    scores: list[list[float]] | None
    source: str

    def __len__(self) -> int:
        return len(self.queries)


def _read_table(path: Path) -> list[dict]:
    suffix = path.suffix.lower()
    try:
        if path.is_dir():
            import datasets

            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                if "train" not in ds:
                    raise DataError(f"{path}: a DatasetDict without a 'train' split (has {list(ds)})")
                ds = ds["train"]
            return ds.to_list()
        if suffix in (".jsonl", ".json"):
            rows = []
            with path.open(encoding="utf-8") as f:
                for i, line in enumerate(f, start=1):
                    if not line.strip():
                        continue
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise DataError(f"{path} row {i}: not valid JSON ({e.msg}); one JSON object per line") from e
            return rows
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
        if suffix == ".csv":
            import csv

            with path.open(encoding="utf-8", newline="") as f:
                return list(csv.DictReader(f))
    except DataError:
        raise
    except Exception as e:  # a corrupt parquet/arrow file: one line, not a traceback
        raise DataError(f"{path}: cannot be read ({type(e).__name__}: {e})") from e
    raise DataError(f"{path}: unsupported data format '{suffix}'; use .jsonl, .parquet, .csv or a save_to_disk dir")


def _text(row: dict, col: str, where: str) -> str:
    value = row.get(col) if isinstance(row, dict) else None
    if not isinstance(value, str) or not value.strip():
        problem = (
            "missing" if value is None else "empty" if isinstance(value, str) else f"not text ({type(value).__name__})"
        )
        raise DataError(f"{where}: column '{col}' is {problem}; fix the row or map data.train.columns.{col}")
    return value


def load_rows(src: DataSource, distillation: bool) -> Rows:
    """Read ``src`` and check every row has what the loss needs."""
    path = Path(src.path)
    if not path.exists():
        raise DataError(f"training data not found: {path} (check data.train.path)")
    table = _read_table(path)
    if src.limit:
        table = table[: src.limit]
    if not table:
        raise DataError(f"{path}: the dataset is empty; it needs at least one row")
    cols = src.columns
    queries, documents, scores = [], [], []
    for i, row in enumerate(table, start=1):
        where = f"{path} row {i}"
        queries.append(_text(row, cols.query, where))
        if distillation:
            docs, sc = row.get(cols.documents), row.get(cols.scores)
            if not isinstance(docs, list) or not docs or not all(isinstance(d, str) and d.strip() for d in docs):
                raise DataError(f"{where}: column '{cols.documents}' must be a non-empty list of texts")
            if not isinstance(sc, list) or len(sc) != len(docs):
                raise DataError(f"{where}: column '{cols.scores}' must list one score per document ({len(docs)})")
            if len(docs) != len(documents[0] if documents else docs):
                raise DataError(f"{where}: {len(docs)} documents, but row 1 has {len(documents[0])}; use a fixed count")
            documents.append(list(docs))
            scores.append([float(s) for s in sc])
        else:
            documents.append([_text(row, cols.positive, where)] + [_text(row, c, where) for c in cols.negatives])
    return Rows(queries, documents, scores if distillation else None, str(path))


@dataclass
class Batch:
    """One rank's share of one optimizer step, tokenised and on the device."""

    queries: dict[str, torch.Tensor]  # (b, q_tokens)
    documents: dict[str, torch.Tensor]  # (b * docs_per_query, d_tokens), query-major
    docs_per_query: int
    query_length: int
    document_length: int
    scores: torch.Tensor | None = None  # (b, docs_per_query), distillation only


def _tokenize(model, texts: list[str], is_query: bool, chunk: int = 1024) -> dict[str, torch.Tensor]:
    """Tokenise once, padded to the model's fixed length; batches later trim unused columns."""
    parts = [model.tokenize(texts[i : i + chunk], is_query=is_query, pad=True) for i in range(0, len(texts), chunk)]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


class TokenizedData:
    """All rows tokenised up front (not in a collator on every step), plus the batch schedule."""

    def __init__(self, rows: Rows, model, per_device: int, world_size: int, seed: int):
        self.rows = rows
        self.per_device = per_device
        self.world_size = world_size
        self.global_batch = per_device * world_size
        self.seed = seed
        self.docs_per_query = len(rows.documents[0])
        if len(rows) < self.global_batch:
            raise DataError(
                f"{rows.source}: {len(rows)} rows cannot fill one global batch of {self.global_batch} "
                f"({world_size} ranks x {per_device}); lower training.per_device_batch_size"
            )
        self.query_length = model.query_length
        self.document_length = model.document_length
        self.queries = _tokenize(model, rows.queries, is_query=True)
        flat_docs = [d for docs in rows.documents for d in docs]
        self.documents = {
            k: v.view(len(rows), self.docs_per_query, -1) for k, v in _tokenize(model, flat_docs, False).items()
        }
        self.scores = torch.tensor(rows.scores) if rows.scores is not None else None

    @property
    def steps_per_epoch(self) -> int:
        return len(self.rows) // self.global_batch

    def total_steps(self, epochs: float | None, max_steps: int | None) -> int:
        return max_steps if max_steps else max(1, math.ceil(epochs * self.steps_per_epoch))

    def indices(self, step: int, rank: int) -> torch.Tensor:
        epoch, pos = divmod(step, self.steps_per_epoch)
        g = torch.Generator().manual_seed(self.seed + epoch)
        perm = torch.randperm(len(self.rows), generator=g)
        global_idx = perm[pos * self.global_batch : (pos + 1) * self.global_batch]
        return global_idx[rank * self.per_device : (rank + 1) * self.per_device]

    def batch(self, step: int, rank: int, device: torch.device) -> Batch:
        idx = self.indices(step, rank)
        q = {k: v[idx] for k, v in self.queries.items()}
        d = {k: v[idx].flatten(0, 1) for k, v in self.documents.items()}
        width = int(d["attention_mask"].sum(1).max())  # trim padding columns no document uses
        d = {k: v[:, :width] for k, v in d.items()}
        to = lambda f: {k: v.to(device, non_blocking=True) for k, v in f.items()}  # noqa: E731
        scores = self.scores[idx].to(device) if self.scores is not None else None
        return Batch(to(q), to(d), self.docs_per_query, self.query_length, self.document_length, scores)
