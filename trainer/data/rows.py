"""Training rows: read from their source once per node, checked, and kept as an Arrow file.

The source (.jsonl/.json, .parquet, .csv, a ``save_to_disk`` directory, or a hub dataset) is read once
per node, every row checked, and written as an Arrow IPC file of three columns: ``query``,
``documents`` (positive first, or the distillation candidates) and, for distillation, ``scores``.
The file lives in ``data.cache_dir`` keyed by the source's path, size and mtime and the column
mapping; it is written under a lock into a temporary name and renamed, so a restarted or concurrent
process reuses it and never reads a half-written one. Beside it, a sha256 of every row, computed while
converting: the rows' identity by content (:meth:`Rows.identity`), which mined parts and checkpoints are
checked against. Rows are read by positional reads of their 256-row record batch: a million rows cost
page cache (the kernel's, reclaimable), not Python objects or resident memory.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from filelock import FileLock

from trainer.atomic import whole_or_absent
from trainer.config.base import hub_repo
from trainer.config.schema import ConfigError, DataSource

__all__ = ["DataError", "Rows", "load_rows", "locked", "ROWS_PER_BATCH", "iter_jsonl", "text_field", "document_text"]

log = logging.getLogger(__name__)
_FORMAT = 5  # bump when the cached Arrow layout changes (4: batches always whole; 5: a sha256 of every row)
_CHUNK = 8192  # rows read from the source at a time (a multiple of ROWS_PER_BATCH)
ROWS_PER_BATCH = 256  # rows per Arrow record batch: the unit of a random read


class DataError(ConfigError):
    """Bad training data; the message names the file, the row and the column."""


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
        self.sha256: str = info["sha256"]  # of every row (_RowDigest)
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

    def identity(self) -> str:
        """What these rows are, by content: a sha256 of every row (computed once, while converting). Another
        file, one row edited, or rows mined with other settings change it; the same rows staged again (another
        path, time or format) do not. Saved with checkpoints and mined parts, and checked against them."""
        return f"sha256:{self.sha256[:32]}"

    def sampled_identity(self, samples: int = 64) -> str:
        """0.3's identity of these rows: the count, the width and ``samples`` rows spread evenly over the file
        (one row edited between the samples went unnoticed). Kept only to recognise the checkpoints and mined
        parts 0.3 wrote, which are checked as it did."""
        n = len(self)
        idx = sorted({round(i * (n - 1) / max(1, samples - 1)) for i in range(samples)}) if n else []
        payload = [n, self.docs_per_query, *self.take(idx)]
        return hashlib.sha256(json.dumps(payload, default=str).encode()).hexdigest()[:20]

    def all(self) -> tuple[list[str], list[list[str]], list[list[float]] | None]:
        """Every row, in one read (small sets: ``data.pretokenize``, tests)."""
        table = self._file().read_all()
        scores = table.column("scores").to_pylist() if self.has_scores else None
        return table.column("query").to_pylist(), table.column("documents").to_pylist(), scores


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
        with path.open(encoding="utf-8-sig", newline="") as f:  # -sig: Excel writes a byte-order mark
            reader, chunk = csv.DictReader(f), []
            for row in reader:
                chunk.append(row)
                if len(chunk) == _CHUNK:
                    yield chunk
                    chunk = []
            yield chunk
    else:
        raise DataError(f"{path}: unsupported data format '{suffix}'; use .jsonl, .parquet, .csv or a save_to_disk dir")


def iter_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    """``(where, value)`` for each non-blank line of a JSON Lines file, ``where`` naming the file and row:
    every JSON Lines file the trainer reads (training rows, a mining corpus, a BEIR set) goes through here."""
    try:
        with path.open(encoding="utf-8-sig") as f:  # -sig: a byte-order mark (Windows editors write one) is skipped
            for i, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path} row {i}: not valid JSON ({e.msg}); one JSON object per line") from None
                except RecursionError:
                    raise DataError(f"{path} row {i}: nested too deeply") from None
                yield f"{path} row {i}", value
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start}); save the file as UTF-8") from None


def text_field(value: Any, key: str, where: str, optional: bool = False) -> str:
    """``value[key]`` as non-empty text that UTF-8 can encode, or one line naming the row and the key."""
    text = value.get(key) if isinstance(value, dict) else None
    if optional and isinstance(value, dict) and text in (None, ""):
        return ""
    if not isinstance(value, dict):
        raise DataError(f"{where}: not a JSON object; one object per line")
    if problem := _text_problem(text):
        raise DataError(f"{where}: '{key}' is {problem}")
    _encodable(text, key, where)
    return text


def document_text(value: Any, where: str) -> str:
    """A corpus document (BEIR's ``title`` and ``text``) as the one text it is encoded as: the title, a
    space and the text, or the text alone, unchanged, so that it equals the same text given as a training
    positive (mining finds positives in its corpus by their text)."""
    text, title = text_field(value, "text", where), text_field(value, "title", where, optional=True)
    return f"{title} {text}".strip() if title else text


def _text_problem(text: Any) -> str | None:
    """What is wrong with a value that should be non-empty text, or None."""
    if isinstance(text, str) and text.strip():
        return None
    return "missing" if text is None else "empty" if isinstance(text, str) else f"not text ({type(text).__name__})"


def _jsonl_chunks(path: Path) -> Iterator[list[dict]]:
    chunk: list[dict] = []
    for _, value in iter_jsonl(path):
        chunk.append(value)
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
    if problem := _text_problem(value):
        raise DataError(f"{where}: column '{col}' is {problem}; fix the row or map data.train.columns.{col}")
    _encodable(value, col, where)
    return value


def _encodable(value: str, col: str, where: str) -> None:
    """JSON's "\\ud800" decodes to a lone surrogate, which no UTF-8 writer (Arrow, the tokenizer) takes."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DataError(
            f"{where}: '{col}' holds a lone surrogate (U+{ord(value[e.start]):04X}, an unpaired \\u escape); "
            "fix the text in the row"
        ) from None


class _RowChecker:
    """Checks one raw row and turns it into (query, documents, scores); remembers the document count."""

    def __init__(self, src: DataSource, distillation: bool, source: str):
        self.cols, self.distillation, self.source, self.width = src.columns, distillation, source, None
        self.negatives = list(src.columns.negatives)
        # columns.negatives not set: its default column where the rows have it, else plain pairs
        self.pairs_if_absent = "negatives" not in src.columns.model_fields_set

    def __call__(self, row: dict, n: int) -> tuple[str, list[str], list[float] | None]:
        where, cols = f"{self.source} row {n}", self.cols
        query = _text(row, cols.query, where)
        if not self.distillation:
            if self.pairs_if_absent and n == 1 and isinstance(row, dict) and not set(self.negatives) & set(row):
                self.negatives = []  # (query, positive) pairs, as PyLate's own script trains them
                log.info(
                    "%s: no %s column: plain (query, positive) pairs, trained with in-batch negatives only "
                    "(data.train.columns.negatives names a column of hard negatives; mine: finds them)",
                    self.source,
                    " or ".join(repr(c) for c in cols.negatives),
                )
            documents = [_text(row, cols.positive, where)]
            for col in self.negatives:  # a column holds one negative, or a list of them (mined rows)
                value = row.get(col)
                if value == []:
                    raise DataError(
                        f"{where}: column '{col}' is an empty list; give it at least one negative, or drop the row "
                        "(pairs without negatives go in a file of their own, with data.train.columns.negatives: [])"
                    )
                many = value if isinstance(value, list) else [value]
                documents += [
                    _text({col: v}, col, f"{where} ({col}[{i}])" if many is value else where)
                    for i, v in enumerate(many)
                ]
            self._same_width(len(documents), where)
            return query, documents, None
        docs, sc = row.get(cols.documents), row.get(cols.scores)
        if not isinstance(docs, list) or not docs or not all(isinstance(d, str) and d.strip() for d in docs):
            raise DataError(f"{where}: column '{cols.documents}' must be a non-empty list of texts")
        for d in docs:
            _encodable(d, cols.documents, where)
        if not isinstance(sc, list) or len(sc) != len(docs):
            raise DataError(f"{where}: column '{cols.scores}' must list one score per document ({len(docs)})")
        if not all(isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) for s in sc):
            # JSON's NaN and Infinity parse as floats, and one would make every loss after it NaN
            raise DataError(f"{where}: column '{cols.scores}' must hold finite numbers (no NaN or Infinity)")
        if big := next((s for s in sc if abs(s) > _FLOAT32_MAX), None):  # finite as float64, inf as float32
            raise DataError(
                f"{where}: column '{cols.scores}' holds {big:.3g}, beyond float32 (the precision rows train in, "
                f"at most {_FLOAT32_MAX:.3g}); rescale the scores"
            )
        self._same_width(len(docs), where)
        return query, list(docs), [float(s) for s in sc]

    def _same_width(self, count: int, where: str) -> None:
        """Every row scores the same number of documents (one tensor shape per batch)."""
        self.width = self.width or count
        if count != self.width:
            raise DataError(f"{where}: {count} documents, but row 1 has {self.width}; use a fixed count")


class _RowDigest:
    """A sha256 of every row's content, fed the Arrow columns as they are written: per text column the byte
    length of each text and their UTF-8 bytes, per list column each row's list length and then its items, and
    the scores' float32 bytes, each a stream of its own. A stream does not depend on where the chunks break,
    so the same rows hash alike however the reader chunked them (a .jsonl or its .parquet copy). Arrow's
    buffers go to hashlib as they are: 2.3 s of a 1M-row conversion's 47 s (``bench/data_scale.py``,
    ``hash_seconds``); JSON-encoding the rows to hash them cost five times as much."""

    def __init__(self) -> None:
        self._streams: dict[str, Any] = {}
        self.seconds = 0.0

    def update(self, table: pa.Table) -> None:
        start = time.perf_counter()
        for name in table.column_names:
            for chunk in table.column(name).chunks:
                if len(chunk):
                    self._array(name, chunk)
        self.seconds += time.perf_counter() - start

    def _array(self, name: str, arr: pa.Array) -> None:
        if pa.types.is_list(arr.type):
            self._feed(f"{name} lengths", np.diff(_offsets(arr)))
            self._array(f"{name} items", arr.flatten())  # flatten() honours a slice, .values does not
        elif pa.types.is_string(arr.type):
            offsets = _offsets(arr)
            self._feed(f"{name} lengths", np.diff(offsets))
            self._feed(f"{name} bytes", memoryview(arr.buffers()[2])[offsets[0] : offsets[-1]])
        else:  # the scores' floats (no nulls: every row is checked)
            self._feed(name, arr.to_numpy(zero_copy_only=True))

    def _feed(self, stream: str, data: Any) -> None:
        self._streams.setdefault(stream, hashlib.sha256()).update(data)

    def hexdigest(self) -> str:
        whole = hashlib.sha256()
        for stream in sorted(self._streams):
            whole.update(stream.encode() + b"\0" + self._streams[stream].digest())
        return whole.hexdigest()


def _offsets(arr: pa.Array) -> np.ndarray:
    """The int32 offsets of a string or list array's items, for its own slice of the buffer."""
    return np.frombuffer(arr.buffers()[1], dtype=np.int32, count=len(arr) + 1, offset=arr.offset * 4)


def _convert(src: DataSource, path: Path, distillation: bool, out: Path, label: str) -> int:
    """Stream the source into an Arrow IPC file, checking every row; returns the row count."""
    from tqdm import tqdm

    check, schema, n, digest = _RowChecker(src, distillation, label), _schema(distillation), 0, _RowDigest()
    pending: list[tuple[str, list[str], list[float] | None]] = []

    def write(rows: list) -> None:
        cols: dict[str, list[Any]] = {"query": [r[0] for r in rows], "documents": [r[1] for r in rows]}
        if distillation:
            cols["scores"] = [r[2] for r in rows]
        table = pa.Table.from_pydict(cols, schema=schema)
        digest.update(table)
        writer.write_table(table, max_chunksize=ROWS_PER_BATCH)

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
    docs = check.width or 1 + len(check.negatives)
    info = {"rows": n, "docs_per_query": docs, "scores": distillation}
    info |= {"sha256": digest.hexdigest(), "hash_seconds": round(digest.seconds, 2)}
    out.with_suffix(".json").write_text(json.dumps(info))
    return n


_FLOAT32_MAX = 3.4028234663852886e38


def _fingerprint(path: Path, src: DataSource, distillation: bool) -> str:
    parts: list[Any] = [_FORMAT, str(path.resolve()), src.columns.model_dump(), src.limit, distillation]
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    parts += [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:20]


def locked(lock_path: Path) -> FileLock:
    """An exclusive lock across this node's processes (and pods sharing a volume, where it supports locks)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(lock_path)


def load_rows(src: DataSource, distillation: bool, cache_dir: str | Path = ".cache/colbert-k8s") -> Rows:
    """The checked rows of ``src`` from the node's Arrow cache, converting the source the first time."""
    if hub_repo(src.path) is not None or src.split:
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
                with whole_or_absent(tmp, final):  # a full disk in data.cache_dir: DiskFull's one line
                    count = _convert(src, path, distillation, tmp, str(path))
                    if count == 0:
                        raise DataError(f"{path}: the dataset is empty; it needs at least one row")
                    os.replace(tmp.with_suffix(".json"), final.with_suffix(".json"))
                    os.replace(tmp, final)  # last: an existing rows.arrow means a complete pair
                mib = final.stat().st_size / 2**20
                log.info("converted %s to %s (%d rows, %.0f MiB, each row hashed)", path, final, count, mib)
            finally:
                tmp.with_suffix(".json").unlink(missing_ok=True)
    try:
        rows = Rows(final, str(path))
        rows.take([0])
    except (pa.ArrowInvalid, OSError, ValueError, KeyError) as e:
        raise DataError(f"{final}: the cached rows are unreadable ({e}); delete that directory to rebuild it") from None
    return rows


def _hub_rows(src: DataSource, distillation: bool, cache_dir: Path) -> Rows:
    """A dataset on the Hugging Face Hub (``hf://datasets/ORG/NAME`` or ``ORG/NAME`` with ``split``)."""
    name = repo.repo_id if (repo := hub_repo(src.path)) is not None else src.path  # ORG/NAME with data.train.split
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
