"""Training data in every supported format, with column mapping, and the batch schedule."""

from __future__ import annotations

import csv
import json

import pytest

from trainer.config import Columns, DataSource
from trainer.data import DataError, load_rows

ROWS = [{"q": f"question {i}", "pos": f"answer {i}", "hard": f"wrong {i}", "extra": i} for i in range(5)]
COLUMNS = Columns(query="q", positive="pos", negatives=["hard"])


def _write(fmt: str, path):
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif fmt == "csv":
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(ROWS[0]))
            w.writeheader()
            w.writerows(ROWS)
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(ROWS), path)
    else:
        import datasets

        datasets.Dataset.from_list(ROWS).save_to_disk(str(path))
    return path


@pytest.mark.parametrize(
    "fmt,name",
    [("jsonl", "t.jsonl"), ("csv", "t.csv"), ("parquet", "t.parquet"), ("save_to_disk", "ds")],
    ids=["jsonl", "csv", "parquet", "save_to_disk"],
)
def test_every_format_with_column_mapping(fmt, name, tmp_path):
    rows = load_rows(DataSource(path=str(_write(fmt, tmp_path / name)), columns=COLUMNS), distillation=False)
    queries, documents, scores = rows.all()
    assert queries == [r["q"] for r in ROWS] and scores is None
    assert documents == [[r["pos"], r["hard"]] for r in ROWS]


def test_limit_and_unsupported_format(tmp_path):
    path = _write("jsonl", tmp_path / "t.jsonl")
    assert len(load_rows(DataSource(path=str(path), columns=COLUMNS, limit=2), distillation=False)) == 2
    bad = tmp_path / "t.xml"
    bad.write_text("<rows/>")
    with pytest.raises(DataError, match="unsupported data format '.xml'"):
        load_rows(DataSource(path=str(bad)), distillation=False)


def test_distillation_rows_need_one_score_per_document(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"query": "q", "documents": ["a", "b"], "scores": [1.0]}) + "\n")
    with pytest.raises(DataError, match="row 1: column 'scores' must list one score per document"):
        load_rows(DataSource(path=str(path)), distillation=True)


def test_rows_are_found_whatever_chunks_the_reader_hands_out(tmp_path):
    """A save_to_disk set in 7 shards of 100 rows (read back as 100-row chunks): the Arrow copy still
    holds 256-row batches, so every row is where ``take`` looks for it."""
    import datasets

    rows = [{"query": f"q{i}", "positive": f"p{i}", "negative": f"n{i}"} for i in range(700)]
    parts = [datasets.Dataset.from_list(rows[i : i + 100]) for i in range(0, 700, 100)]
    path = tmp_path / "ds"
    datasets.concatenate_datasets(parts).save_to_disk(str(path), num_shards=7)  # shards load as chunks
    loaded = load_rows(DataSource(path=str(path)), distillation=False, cache_dir=tmp_path / "cache")
    idx = [0, 99, 100, 255, 256, 300, 511, 512, 699]
    queries, documents, _ = loaded.take(idx)
    assert queries == [f"q{i}" for i in idx]
    assert documents == [[f"p{i}", f"n{i}"] for i in idx]
    assert loaded.all()[0] == [r["query"] for r in rows]
