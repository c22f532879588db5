"""Training data in every supported format, with column mapping, and the batch schedule."""

from __future__ import annotations

import csv
import json

import pytest

from trainer.config.schema import Columns, DataSource
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


@pytest.mark.parametrize("score", ["NaN", "Infinity", "-Infinity", "true", '"3"'])
def test_distillation_scores_must_be_finite_numbers(score, tmp_path):
    """json.loads reads NaN and Infinity as floats: one such teacher score makes every later loss NaN."""
    path = tmp_path / "d.jsonl"
    good = json.dumps({"query": "q", "documents": ["a", "b"], "scores": [1.0, 0.5]})
    bad = '{"query": "q", "documents": ["a", "b"], "scores": [1.0, ' + score + "]}"
    path.write_text(good + "\n" + bad + "\n")
    with pytest.raises(DataError, match="row 2: column 'scores' must hold finite numbers"):
        load_rows(DataSource(path=str(path)), distillation=True, cache_dir=tmp_path / "cache")


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


BAD_ROWS = [
    # JSON's \ud800 is a lone surrogate: json.loads takes it, Arrow's UTF-8 writer raised a traceback
    (
        "lone-surrogate",
        '{"query": "q\\ud800", "positive": "p", "negative": "n"}',
        "'query' holds a lone surrogate",
    ),
    ("surrogate-in-a-list", '{"query": "q", "positive": "p", "negative": ["n", "\\udfff"]}', "holds a lone surrogate"),
    ("empty-negatives-list", '{"query": "q", "positive": "p", "negative": []}', "column 'negative' is an empty list"),
]


@pytest.mark.parametrize("name,line,message", BAD_ROWS, ids=[c[0] for c in BAD_ROWS])
def test_a_bad_row_is_one_line_naming_it_and_nothing_is_cached(name, line, message, tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"query": "q", "positive": "p", "negative": "n"}) + "\n" + line + "\n")
    with pytest.raises(DataError, match=f"row 2.*{message}"):
        load_rows(DataSource(path=str(path)), distillation=False, cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("*.arrow")), "a half-converted file was left where training reads"


@pytest.mark.parametrize("suffix", ["jsonl", "csv"])
def test_a_byte_order_mark_is_skipped(suffix, tmp_path):
    """Windows editors and Excel start UTF-8 files with a BOM; it is not part of the first row or header."""
    path = tmp_path / f"t.{suffix}"
    body = (
        '{"query": "q", "positive": "p", "negative": "n"}\n'
        if suffix == "jsonl"
        else "query,positive,negative\nq,p,n\n"
    )
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())
    queries, documents, _ = load_rows(DataSource(path=str(path)), distillation=False, cache_dir=tmp_path / "c").all()
    assert queries == ["q"] and documents == [["p", "n"]]


C = '{"_id": "d1", "title": "t", "text": "doc one"}\n{"_id": "d2", "text": "doc two"}\n'
Q = '{"_id": "q1", "text": "a query"}\n'
R = "query-id\tcorpus-id\tscore\nq1\td1\t1\n"
BAD_BEIR = [
    ("corpus-not-json", ('{"_id": "d1",\n', Q, R), "corpus.jsonl row 1: not valid JSON"),
    ("corpus-without-id", ('{"text": "x"}\n', Q, R), "corpus.jsonl row 1: needs an '_id'"),
    ("corpus-without-text", ('{"_id": "d1"}\n', Q, R), "corpus.jsonl row 1: 'text' is missing"),
    ("title-not-text", ('{"_id": "d1", "text": "x", "title": 5}\n', Q, R), "row 1: 'title' is not text (int)"),
    ("corpus-row-a-list", ("[1]\n", Q, R), "corpus.jsonl row 1: needs an '_id'"),
    ("duplicate-id", ('{"_id": "d1", "text": "x"}\n{"_id": "d1", "text": "y"}\n', Q, R), "'d1' appears more than"),
    ("empty-corpus", ("\n", Q, R), "holds no document"),
    ("query-without-text", (C, '{"_id": "q1"}\n', R), "queries.jsonl row 1: 'text' is missing"),
    ("qrels-without-header", (C, Q, "q1\td1\t1\n"), "the first line must be the header"),
    ("qrels-comma-separated", (C, Q, "query-id,corpus-id,score\nq1,d1,1\n"), "the first line must be the header"),
    ("qrels-score-a-word", (C, Q, "query-id\tcorpus-id\tscore\nq1\td1\thigh\n"), "test.tsv line 2: needs"),
    ("qrels-short-row", (C, Q, "query-id\tcorpus-id\tscore\nq1\td1\n"), "test.tsv line 2: needs"),
]


def _beir(root, corpus: str, queries: str, qrels: str):
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text(corpus)
    (root / "queries.jsonl").write_text(queries)
    (root / "qrels" / "test.tsv").write_text(qrels)
    return root


@pytest.mark.parametrize("name,files,message", BAD_BEIR, ids=[c[0] for c in BAD_BEIR])
def test_a_bad_beir_set_is_one_line_naming_the_file_and_row(name, files, message, tmp_path):
    """data.eval_beir is read before training: each of these was a KeyError/TypeError/ValueError traceback."""
    from trainer.config.schema import ConfigError
    from trainer.evaluate import load_beir

    with pytest.raises(ConfigError) as e:
        load_beir(_beir(tmp_path / "beir", *files))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_beir_set_with_byte_order_marks_and_numeric_ids_loads(tmp_path):
    from trainer.evaluate import load_beir

    corpus = '\ufeff{"_id": 1, "text": "doc one"}\n{"_id": "d2", "title": "", "text": "doc two"}\n'
    split = load_beir(_beir(tmp_path / "beir", corpus, "\ufeff" + Q, "\ufeffquery-id\tcorpus-id\tscore\nq1\t1\t1\n"))
    assert split.corpus_ids == ["1", "d2"] and split.corpus == ["doc one", "doc two"]
    assert split.queries == ["a query"] and split.qrels == {"q1": {"1": 1}}


def test_mining_and_evaluation_read_a_corpus_document_as_the_same_text(tmp_path):
    """One BEIR directory can be mine.corpus and data.eval_beir: a document must be one text in both, and a
    title-less one must stay byte-equal to the same text given as a training positive."""
    from trainer.evaluate import load_beir
    from trainer.mine import _read_corpus

    corpus = '{"_id": "d1", "title": "Title", "text": "doc one"}\n{"_id": "d2", "text": "  doc two\\n"}\n'
    root = _beir(tmp_path / "beir", corpus, Q, R)
    assert _read_corpus(str(root)) == load_beir(root).corpus == ["Title doc one", "  doc two\n"]
