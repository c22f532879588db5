"""Training data: converted once to an Arrow file, cut into deterministic global batches, tokenised
lazily per batch, only this rank's share.

**Rows.** The source (.jsonl/.json, .parquet, .csv, a ``save_to_disk`` directory, or a hub dataset) is
read once per node, every row checked, and written as an Arrow IPC file of three columns: ``query``,
``documents`` (positive first, or the distillation candidates) and, for distillation, ``scores``.
The file lives in ``data.cache_dir`` keyed by the source's path, size and mtime and the column
mapping; it is written under a lock into a temporary name and renamed, so a restarted or concurrent
process reuses it and never reads a half-written one. Rows are read by positional reads of their
256-row record batch: a million rows cost page cache (the kernel's, reclaimable), not Python objects
or resident memory.

**Schedule.** A batch is a pure function of (seed, step): step ``s`` of epoch ``e`` takes the ``s``-th
slice of ``global_batch`` indices from the epoch's seeded permutation, and rank ``r`` takes the
``r``-th ``per_device`` part of it. Resuming therefore needs only the step, every rank gets an equal
batch (the tail that would not fill a global batch is dropped), and one process with batch ``W*b``
sees exactly the examples that ``W`` ranks with batch ``b`` see together.

**Tokens.** :class:`StreamingData` tokenises a rank's share when its batch is built (in DataLoader
workers, ahead of the step, pinned for the copy to the GPU); :class:`TokenizedData` tokenises every
row up front (``data.pretokenize: true``, for small sets). Both pad to the model's lengths and trim
each batch to its longest document, so they produce identical batches.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from trainer.config import ConfigError, DataSource

__all__ = ["DataError", "Rows", "load_rows", "StreamingData", "TokenizedData", "Batch", "batches"]

log = logging.getLogger(__name__)
_FORMAT = 4  # bump when the cached Arrow layout changes (4: batches always whole)
_CHUNK = 8192  # rows read from the source at a time (a multiple of ROWS_PER_BATCH)
ROWS_PER_BATCH = 256  # rows per Arrow record batch: the unit of a random read


class DataError(ConfigError):
    """Bad training data; the message names the file, the row and the column."""


# ---- rows: one Arrow file per source -------------------------------------------------------------


class Rows:
    """Validated rows in an Arrow IPC file of fixed-size record batches: query, documents, scores.

    A row is read with a positional read of its record batch (``ROWS_PER_BATCH`` rows, a few hundred
    KiB) into memory that is freed after the batch is built: the operating system's page cache does
    the caching, and a process's resident memory does not grow with the data set (a memory map's
    touched pages would count towards it, and a long run touches the whole file)."""

    def __init__(self, path: Path, source: str):
        self.path, self.source = path, source
        info = json.loads(path.with_suffix(".json").read_text())
        self.count, self.docs_per_query, self.has_scores = info["rows"], info["docs_per_query"], info["scores"]
        self._reader: tuple[int, pa.ipc.RecordBatchFileReader] | None = None

    def __len__(self) -> int:
        return self.count

    def _file(self) -> pa.ipc.RecordBatchFileReader:
        if self._reader is None or self._reader[0] != os.getpid():  # one handle per process (workers fork)
            self._reader = (os.getpid(), pa.ipc.open_file(pa.OSFile(str(self.path), "rb")))
        return self._reader[1]

    def take(self, idx: list[int]) -> tuple[list[str], list[list[str]], list[list[float]] | None]:
        """The rows at ``idx``, each read from its record batch (``Table.take`` would read every chunk)."""
        reader, rows = self._file(), []
        for i in idx:
            batch, offset = divmod(int(i), ROWS_PER_BATCH)
            rows.append(reader.get_batch(batch).slice(offset, 1).to_pylist()[0])
        scores = [r["scores"] for r in rows] if self.has_scores else None
        return [r["query"] for r in rows], [r["documents"] for r in rows], scores

    def all(self) -> tuple[list[str], list[list[str]], list[list[float]] | None]:
        """Every row, in one read (small sets: ``data.pretokenize``, tests)."""
        table = self._file().read_all()
        scores = table.column("scores").to_pylist() if self.has_scores else None
        return table.column("query").to_pylist(), table.column("documents").to_pylist(), scores

    @property
    def queries(self) -> list[str]:
        return self.all()[0]

    @property
    def documents(self) -> list[list[str]]:
        return self.all()[1]


def _schema(distillation: bool) -> pa.Schema:
    fields = [pa.field("query", pa.string()), pa.field("documents", pa.list_(pa.string()))]
    if distillation:
        fields.append(pa.field("scores", pa.list_(pa.float32())))
    return pa.schema(fields)


def _raw_chunks(path: Path) -> Iterator[list[dict]]:
    """The source's rows as dicts, a chunk at a time (nothing holds the whole set in Python objects)."""
    suffix = path.suffix.lower()
    if path.is_dir():
        import datasets

        try:
            ds = datasets.load_from_disk(str(path))
        except Exception as e:
            raise DataError(f"{path}: not a datasets save_to_disk directory ({type(e).__name__}: {e})") from None
        if isinstance(ds, datasets.DatasetDict):
            if "train" not in ds:
                raise DataError(f"{path}: a DatasetDict without a 'train' split (has {list(ds)})")
            ds = ds["train"]
        for batch in ds.data.to_batches(_CHUNK):
            yield batch.to_pylist()
    elif suffix in (".jsonl", ".json"):
        yield from _jsonl_chunks(path)
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(path).iter_batches(_CHUNK):
            yield batch.to_pylist()
    elif suffix == ".csv":
        import csv

        with path.open(encoding="utf-8", newline="") as f:
            reader, chunk = csv.DictReader(f), []
            for row in reader:
                chunk.append(row)
                if len(chunk) == _CHUNK:
                    yield chunk
                    chunk = []
            yield chunk
    else:
        raise DataError(f"{path}: unsupported data format '{suffix}'; use .jsonl, .parquet, .csv or a save_to_disk dir")


def _jsonl_chunks(path: Path) -> Iterator[list[dict]]:
    chunk: list[dict] = []
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                chunk.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataError(f"{path} row {i}: not valid JSON ({e.msg}); one JSON object per line") from None
            if len(chunk) == _CHUNK:
                yield chunk
                chunk = []
    yield chunk


def _readable(chunks: Iterator[list[dict]], path: Path) -> Iterator[list[dict]]:
    """A corrupt Parquet/Arrow/CSV file is one line naming it, not a traceback from its reader."""
    try:
        yield from chunks
    except DataError:
        raise
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start}); save the file as UTF-8") from None
    except Exception as e:
        raise DataError(f"{path}: cannot be read ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


def _text(row: dict, col: str, where: str) -> str:
    value = row.get(col) if isinstance(row, dict) else None
    if not isinstance(value, str) or not value.strip():
        problem = (
            "missing" if value is None else "empty" if isinstance(value, str) else f"not text ({type(value).__name__})"
        )
        raise DataError(f"{where}: column '{col}' is {problem}; fix the row or map data.train.columns.{col}")
    return value


class _RowChecker:
    """Checks one raw row and turns it into (query, documents, scores); remembers the document count."""

    def __init__(self, src: DataSource, distillation: bool, source: str):
        self.cols, self.distillation, self.source, self.width = src.columns, distillation, source, None

    def __call__(self, row: dict, n: int) -> tuple[str, list[str], list[float] | None]:
        where, cols = f"{self.source} row {n}", self.cols
        query = _text(row, cols.query, where)
        if not self.distillation:
            return query, [_text(row, cols.positive, where)] + [_text(row, c, where) for c in cols.negatives], None
        docs, sc = row.get(cols.documents), row.get(cols.scores)
        if not isinstance(docs, list) or not docs or not all(isinstance(d, str) and d.strip() for d in docs):
            raise DataError(f"{where}: column '{cols.documents}' must be a non-empty list of texts")
        if not isinstance(sc, list) or len(sc) != len(docs):
            raise DataError(f"{where}: column '{cols.scores}' must list one score per document ({len(docs)})")
        if not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in sc):
            raise DataError(f"{where}: column '{cols.scores}' must hold numbers")
        self.width = self.width or len(docs)
        if len(docs) != self.width:
            raise DataError(f"{where}: {len(docs)} documents, but row 1 has {self.width}; use a fixed count")
        return query, list(docs), [float(s) for s in sc]


def _convert(src: DataSource, path: Path, distillation: bool, out: Path, label: str) -> int:
    """Stream the source into an Arrow IPC file, checking every row; returns the row count."""
    from tqdm import tqdm

    check, schema, n = _RowChecker(src, distillation, label), _schema(distillation), 0
    pending: list[tuple[str, list[str], list[float] | None]] = []

    def write(rows: list) -> None:
        cols: dict[str, list[Any]] = {"query": [r[0] for r in rows], "documents": [r[1] for r in rows]}
        if distillation:
            cols["scores"] = [r[2] for r in rows]
        writer.write_table(pa.Table.from_pydict(cols, schema=schema), max_chunksize=ROWS_PER_BATCH)

    with pa.OSFile(str(out), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        bar = tqdm(desc=f"convert {path.name}", unit=" rows", mininterval=5, disable=None)
        for chunk in _readable(_raw_chunks(path), path):
            if src.limit is not None:
                chunk = chunk[: max(0, src.limit - n)]
            for row in chunk:
                n += 1
                pending.append(check(row, n))
            # only whole record batches until the end: Rows.take finds row i in batch i // ROWS_PER_BATCH,
            # and readers (Parquet row groups, Arrow chunks) hand out chunks of any length
            full = len(pending) - len(pending) % ROWS_PER_BATCH
            if full:
                write(pending[:full])
                del pending[:full]
            bar.update(len(chunk))
        if pending:
            write(pending)
        bar.close()
    docs = check.width if distillation else 1 + len(src.columns.negatives)
    out.with_suffix(".json").write_text(json.dumps({"rows": n, "docs_per_query": docs, "scores": distillation}))
    return n


def _fingerprint(path: Path, src: DataSource, distillation: bool) -> str:
    parts: list[Any] = [_FORMAT, str(path.resolve()), src.columns.model_dump(), src.limit, distillation]
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    parts += [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:20]


@contextlib.contextmanager
def locked(lock_path: Path) -> Iterator[None]:
    """An exclusive lock across processes of this node (pods sharing a volume too, where it supports flock)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load_rows(src: DataSource, distillation: bool, cache_dir: str | Path = ".cache/colbert-k8s") -> Rows:
    """The checked rows of ``src`` from the node's Arrow cache, converting the source the first time."""
    if src.path.startswith("hf://") or src.split:
        return _hub_rows(src, distillation, Path(cache_dir))
    path = Path(src.path)
    if not path.exists():
        raise DataError(f"training data not found: {path} (check data.train.path)")
    key = _fingerprint(path, src, distillation)
    final = Path(cache_dir) / "arrow" / key / "rows.arrow"
    with locked(final.parent.with_suffix(".lock")):
        if not final.is_file():
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = final.with_name(f".rows-{os.getpid()}.tmp")
            try:
                count = _convert(src, path, distillation, tmp, str(path))
                if count == 0:
                    raise DataError(f"{path}: the dataset is empty; it needs at least one row")
                os.replace(tmp.with_suffix(".json"), final.with_suffix(".json"))
                os.replace(tmp, final)  # last: an existing rows.arrow means a complete pair
                log.info("converted %s to %s (%d rows, %.0f MiB)", path, final, count, final.stat().st_size / 2**20)
            finally:
                tmp.unlink(missing_ok=True)
                tmp.with_suffix(".json").unlink(missing_ok=True)
    try:
        rows = Rows(final, str(path))
        rows.take([0])
    except (pa.ArrowInvalid, OSError, ValueError, KeyError) as e:
        raise DataError(f"{final}: the cached rows are unreadable ({e}); delete that directory to rebuild it") from None
    return rows


def _hub_rows(src: DataSource, distillation: bool, cache_dir: Path) -> Rows:
    """A dataset on the Hugging Face Hub (``hf://datasets/ORG/NAME`` or ``ORG/NAME`` with ``split``)."""
    name = src.path.removeprefix("hf://").removeprefix("datasets/")
    split = src.split or "train"
    try:
        import datasets

        ds = datasets.load_dataset(name, split=split, cache_dir=str(cache_dir / "hub"))
    except Exception as e:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1"
        why = "HF_HUB_OFFLINE=1 is set" if offline else f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        raise DataError(
            f"hub dataset {name!r} (split {split!r}) cannot be loaded ({why}); unset HF_HUB_OFFLINE where the "
            "hub is reachable, or save it with datasets' save_to_disk and give that directory or an s3:// copy"
        ) from None
    local = cache_dir / "hub-export" / hashlib.sha256(f"{name}:{split}".encode()).hexdigest()[:16]
    if not local.is_dir():
        ds.save_to_disk(str(local))
    return load_rows(src.model_copy(update={"path": str(local), "split": None}), distillation, cache_dir)


# ---- batches ---------------------------------------------------------------------------------------


@dataclass
class Batch:
    """One rank's share of one optimizer step, tokenised and on the device."""

    queries: dict[str, torch.Tensor]  # (b, q_tokens)
    documents: dict[str, torch.Tensor]  # (b * docs_per_query, d_tokens), query-major
    docs_per_query: int
    query_length: int
    document_length: int
    scores: torch.Tensor | None = None  # (b, docs_per_query), distillation only

    def _map(self, fn) -> Batch:
        tensors = lambda f: {k: fn(v) for k, v in f.items()}  # noqa: E731
        scores = fn(self.scores) if self.scores is not None else None
        return Batch(tensors(self.queries), tensors(self.documents), self.docs_per_query, self.query_length,
                     self.document_length, scores)  # fmt: skip

    def to(self, device: torch.device) -> Batch:
        return self._map(lambda t: t.to(device, non_blocking=True))

    def pin_memory(self) -> Batch:  # DataLoader's pin_memory calls this on custom batch types
        return self._map(lambda t: t.pin_memory())


def _tokenize(model, texts: list[str], is_query: bool, chunk: int = 1024) -> dict[str, torch.Tensor]:
    """Padded to the model's fixed length; batches trim unused columns later."""
    parts = [model.tokenize(texts[i : i + chunk], is_query=is_query, pad=True) for i in range(0, len(texts), chunk)]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def _trimmed(queries: dict, documents: dict, dpq: int, model, scores) -> Batch:
    width = int(documents["attention_mask"].sum(1).max())  # trim padding columns no document uses
    documents = {k: v[:, :width] for k, v in documents.items()}
    return Batch(queries, documents, dpq, model.query_length, model.document_length, scores)


class _Schedule:
    """The (seed, step) -> indices arithmetic both data classes share; subclasses build ``host_batch``."""

    def __init__(self, rows: Rows, model, per_device: int, world_size: int, seed: int):
        self.rows, self.model, self.per_device, self.world_size, self.seed = rows, model, per_device, world_size, seed
        self.global_batch = per_device * world_size
        self.docs_per_query = rows.docs_per_query
        if len(rows) < self.global_batch:
            raise DataError(
                f"{rows.source}: {len(rows)} rows cannot fill one global batch of {self.global_batch} "
                f"({world_size} ranks x {per_device}); lower training.per_device_batch_size or add rows"
            )
        self._perm: tuple[int, torch.Tensor] | None = None

    @property
    def steps_per_epoch(self) -> int:
        return len(self.rows) // self.global_batch

    def total_steps(self, epochs: float | None, max_steps: int | None) -> int:
        return max_steps if max_steps else max(1, math.ceil(epochs * self.steps_per_epoch))

    def indices(self, step: int, rank: int) -> torch.Tensor:
        epoch, pos = divmod(step, self.steps_per_epoch)
        if self._perm is None or self._perm[0] != epoch:  # one permutation per epoch, not per step
            g = torch.Generator().manual_seed(self.seed + epoch)
            self._perm = (epoch, torch.randperm(len(self.rows), generator=g))
        global_idx = self._perm[1][pos * self.global_batch : (pos + 1) * self.global_batch]
        return global_idx[rank * self.per_device : (rank + 1) * self.per_device]

    def host_batch(self, step: int, rank: int) -> Batch:
        raise NotImplementedError

    def batch(self, step: int, rank: int, device: torch.device) -> Batch:
        return self.host_batch(step, rank).to(device)


class StreamingData(_Schedule):
    """Tokenises only this rank's rows of a step, when the step's batch is built."""

    def host_batch(self, step: int, rank: int) -> Batch:
        queries, documents, scores = self.rows.take(self.indices(step, rank).tolist())
        q = _tokenize(self.model, queries, is_query=True)
        d = _tokenize(self.model, [x for docs in documents for x in docs], is_query=False)
        s = torch.tensor(scores) if scores is not None else None
        return _trimmed(q, d, self.docs_per_query, self.model, s)


class TokenizedData(_Schedule):
    """Every row tokenised up front (``data.pretokenize: true``): fast steps, memory linear in rows."""

    def __init__(self, rows: Rows, model, per_device: int, world_size: int, seed: int):
        super().__init__(rows, model, per_device, world_size, seed)
        queries, documents, scores = rows.all()
        self.queries = _tokenize(model, queries, is_query=True)
        flat_docs = [d for docs in documents for d in docs]
        self.documents = {
            k: v.view(len(rows), self.docs_per_query, -1) for k, v in _tokenize(model, flat_docs, False).items()
        }
        self.scores = torch.tensor(scores) if scores is not None else None

    def host_batch(self, step: int, rank: int) -> Batch:
        idx = self.indices(step, rank)
        q = {k: v[idx] for k, v in self.queries.items()}
        d = {k: v[idx].flatten(0, 1) for k, v in self.documents.items()}
        return _trimmed(q, d, self.docs_per_query, self.model, self.scores[idx] if self.scores is not None else None)


class _Steps(torch.utils.data.Dataset):
    """Item ``i`` of the remaining run -> this rank's host batch (what DataLoader workers build).

    With gradient accumulation a step has ``accumulation`` micro-batches; micro-batch ``m`` of rank
    ``r`` is virtual rank ``m * world + r`` of the step's global batch."""

    def __init__(self, data: _Schedule, start: int, total: int, rank: int, world: int, accumulation: int):
        self.data, self.start, self.total, self.rank = data, start, total, rank
        self.world, self.accumulation = world, accumulation

    def __len__(self) -> int:
        return (self.total - self.start) * self.accumulation

    def __getitem__(self, i: int) -> Batch:
        step, micro = divmod(i, self.accumulation)
        return self.data.host_batch(self.start + step, micro * self.world + self.rank)


def _worker_init(_worker_id: int) -> None:
    """Workers leave SIGTERM to the trainer: a signal to the whole process group (``local``, some
    runtimes) must not kill the batch feed before the trainer has written its stop checkpoint."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def batches(
    data: _Schedule,
    start: int,
    total: int,
    rank: int,
    device: torch.device,
    workers: int,
    world: int = 1,
    accumulation: int = 1,
) -> Iterator[Batch]:
    """Batches for steps ``start..total-1`` on ``device``, built ``workers`` steps ahead in worker
    processes (0: in this process), in pinned memory when the device is a GPU."""
    loader = torch.utils.data.DataLoader(
        _Steps(data, start, total, rank, world, accumulation),
        batch_size=None,
        shuffle=False,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        prefetch_factor=2 if workers else None,
        persistent_workers=False,
        worker_init_fn=_worker_init,
    )
    for batch in loader:
        yield batch.to(device)
