"""Remote sources over real protocols (moto's S3 server, an HTTP server with ranges and dropped
connections): staging, atomic resumable downloads, cache reuse, and one line for every bad source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import write_triplets
from tests.helpers.local import local_command, s3_flags
from tests.helpers.stores import FileServer, MotoS3, moto_available
from trainer.config.schema import DataSource
from trainer.data import DataError, load_rows
from trainer.storage import sources
from trainer.storage.sources import SourceError, stage

pytestmark = pytest.mark.skipif(moto_available() is not None, reason=str(moto_available()))


@pytest.fixture(scope="module")
def s3():
    server = MotoS3()
    yield server
    server.close()


@pytest.fixture
def s3_env(s3, monkeypatch):
    for k, v in s3.env.items():
        monkeypatch.setenv(k, v)
    return s3


@pytest.fixture
def files(tmp_path):
    root = tmp_path / "served"
    root.mkdir()
    write_triplets(root / "train.jsonl", 24)
    server = FileServer(root)
    yield server, root
    server.close()


def test_s3_object_is_staged_once_and_reused(s3_env, tmp_path, caplog):
    data = write_triplets(tmp_path / "train.jsonl", 24).read_bytes()
    s3_env.bucket("data-a")
    s3_env.put("data-a", "sets/train.jsonl", data)
    cache = tmp_path / "cache"
    path = stage("s3://data-a/sets/train.jsonl", cache)
    assert path.read_bytes() == data and path.name == "train.jsonl"
    assert not list(cache.rglob("*.part"))
    caplog.set_level("INFO", logger="trainer.storage.sources")
    assert stage("s3://data-a/sets/train.jsonl", cache) == path  # a restarted pod: no second download
    assert "using the cached copy of s3://data-a/sets/train.jsonl" in caplog.text


def test_s3_prefix_is_a_directory(s3_env, tmp_path, tiny_model):
    s3_env.bucket("models")
    s3_env.put_dir("models", "tiny", tiny_model)
    staged = stage("s3://models/tiny/", tmp_path / "cache")
    assert sorted(p.name for p in staged.iterdir()) == sorted(p.name for p in tiny_model.iterdir())
    assert (staged / "config.json").read_bytes() == (tiny_model / "config.json").read_bytes()


def test_http_download_survives_a_dropped_connection(files, tmp_path, monkeypatch):
    server, root = files
    monkeypatch.setattr(sources, "_CHUNK", 1024)  # several range requests per file
    monkeypatch.setattr(sources.time, "sleep", lambda s: None)
    server.drop(2)
    path = stage(f"{server.url}/train.jsonl", tmp_path / "cache")
    assert path.read_bytes() == (root / "train.jsonl").read_bytes()
    ranges = [r for r in server.requests if r.startswith("GET")]
    assert len(ranges) > (root / "train.jsonl").stat().st_size // 1024  # it continued, range by range


def test_http_download_that_keeps_failing_leaves_nothing_usable(files, tmp_path, monkeypatch):
    server, root = files
    monkeypatch.setattr(sources, "_RETRIES", 1)
    monkeypatch.setattr(sources.time, "sleep", lambda s: None)
    server.drop(100)
    cache = tmp_path / "cache"
    with pytest.raises(SourceError) as e:
        stage(f"{server.url}/train.jsonl", cache)
    assert "failed 2 times" in str(e.value) and "the next start continues" in str(e.value)
    assert not list(cache.rglob(".complete")) and not [p for p in cache.rglob("train.jsonl")]
    assert list(cache.rglob("train.jsonl.part"))  # kept for the next start, never used as the file
    server.drop(0)
    path = stage(f"{server.url}/train.jsonl", cache)  # the next start finishes it
    assert path.read_bytes() == (root / "train.jsonl").read_bytes()


BAD_SOURCES = [
    ("missing-object", "s3://data-b/nope.jsonl", "no such object"),
    ("missing-prefix", "s3://data-b/nothing/", "no objects under this prefix"),
    ("missing-bucket", "s3://no-such-bucket/x.jsonl", "s3://no-such-bucket/x.jsonl"),
    ("credentials-in-url", "https://user:hunter2@127.0.0.1:9/x.jsonl", "credentials in a URL are refused"),
    ("unreachable", "http://127.0.0.1:9/train.jsonl", "cannot be reached"),
    # obstore's builder raised its own exception (a traceback) for a store it cannot even configure
    ("azure-without-account", "az://container/train.jsonl", "cannot be opened"),
]


@pytest.mark.parametrize("name,url,message", BAD_SOURCES, ids=[b[0] for b in BAD_SOURCES])
def test_bad_source_is_one_line(s3_env, tmp_path, name, url, message, monkeypatch):
    monkeypatch.setattr(sources.time, "sleep", lambda s: None)
    s3_env.bucket("data-b")
    with pytest.raises(SourceError) as e:
        stage(url, tmp_path / "cache")
    text = str(e.value)
    assert message in text and "\n" not in text and "hunter2" not in text
    assert not list((tmp_path / "cache").rglob(".complete"))


def test_http_404_is_one_line(files, tmp_path):
    server, _ = files
    with pytest.raises(SourceError, match="no such object"):
        stage(f"{server.url}/missing.jsonl", tmp_path / "cache")


def test_hub_name_offline_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DataError) as e:
        load_rows(DataSource(path="hf://datasets/org/msmarco-triplets"), False, tmp_path)
    assert "hub dataset 'org/msmarco-triplets' (split 'train') cannot be loaded (HF_HUB_OFFLINE=1 is set)" in str(
        e.value
    )


BAD_DATA = [
    ("wrong-column", b'{"q": "a", "positive": "b", "negative": "c"}\n', "t.jsonl", "column 'query' is missing"),
    ("corrupt-parquet", b"PAR1 not really parquet", "t.parquet", "cannot be read"),
    ("empty", b"", "t.jsonl", "the dataset is empty"),
    ("latin-1", '{"query": "caf\xe9"}\n'.encode("latin-1"), "t.jsonl", "not UTF-8"),
]


@pytest.mark.parametrize("name,content,fname,message", BAD_DATA, ids=[b[0] for b in BAD_DATA])
def test_bad_data_is_one_line_and_not_cached(tmp_path, name, content, fname, message):
    path = tmp_path / fname
    path.write_bytes(content)
    with pytest.raises(DataError) as e:
        load_rows(DataSource(path=str(path)), False, tmp_path / "cache")
    assert message in str(e.value) and str(path) in str(e.value)
    assert not list((tmp_path / "cache").rglob("*.arrow")) and not list((tmp_path / "cache").rglob("*.tmp"))


def test_too_small_for_one_global_batch(tmp_path, tiny_model):
    from trainer.data.batches import StreamingData
    from trainer.model import build_model

    data = write_triplets(tmp_path / "t.jsonl", 3)
    rows = load_rows(DataSource(path=str(data)), False, tmp_path / "cache")
    with pytest.raises(DataError, match="3 rows cannot fill one global batch of 8"):
        StreamingData(rows, build_model(_model_cfg(tiny_model), "cpu"), 4, 2, 0)


def _model_cfg(path):
    from trainer.config.schema import ModelConfig

    return ModelConfig(name_or_path=str(path), query_length=16, document_length=48)


def test_streaming_batches_equal_pretokenized_batches(tmp_path, tiny_model):
    """Lazy per-rank tokenisation builds exactly the tensors the up-front path builds."""
    import torch

    from trainer.data.batches import StreamingData, TokenizedData, batches
    from trainer.model import build_model

    rows = load_rows(DataSource(path=str(write_triplets(tmp_path / "t.jsonl", 40))), False, tmp_path / "cache")
    model = build_model(_model_cfg(tiny_model), torch.device("cpu"))
    eager, lazy = TokenizedData(rows, model, 4, 2, 3), StreamingData(rows, model, 4, 2, 3)
    fed = list(batches(lazy, 0, 6, 1, torch.device("cpu"), workers=1))
    for step in range(6):
        a, b = eager.host_batch(step, 1), fed[step]
        for k in a.queries:
            assert torch.equal(a.queries[k], b.queries[k])
        for k in a.documents:
            assert torch.equal(a.documents[k], b.documents[k])


class _Labels:
    """A model stand-in whose "tokens" are each text's own id: a batch says which texts it holds."""

    query_length, document_length = 1, 1

    def __init__(self):
        self.ids: dict[str, int] = {}

    def tokenize(self, texts, is_query, pad):
        ids = torch.tensor([[self.ids.setdefault(t, len(self.ids) + 1)] for t in texts])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def texts(self, ids: torch.Tensor) -> list[str]:
        names = {v: k for k, v in self.ids.items()}
        return [names[int(i)] for i in ids.flatten()]


@pytest.mark.parametrize("pretokenize", [False, True], ids=["streaming", "pretokenized"])
def test_a_step_holds_each_rows_documents_in_order_and_splits_as_one_batch(tmp_path, pretokenize):
    """Against the rows' own texts: a step holds each row's positive, then its negatives in the row's order; 2
    ranks x 2 rows take exactly the queries and documents 1 rank x 4 takes, into the next epoch."""
    from trainer.data.batches import StreamingData, TokenizedData

    path = tmp_path / "pool.jsonl"
    rows_in = [
        {"query": f"q{i}", "positive": f"p{i}", **{f"n{j}": f"n{j} of {i}" for j in range(3)}} for i in range(16)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows_in))
    rows = load_rows(DataSource(path=str(path), columns={"negatives": ["n0", "n1", "n2"]}), False, tmp_path / "c")
    kind = TokenizedData if pretokenize else StreamingData
    two, one = kind(rows, _Labels(), 2, 2, 7), kind(rows, _Labels(), 4, 1, 7)
    assert two.docs_per_query == 4 and two.steps_per_epoch == 4
    for step in range(2 * two.steps_per_epoch):
        shares = [two.host_batch(step, v) for v in range(2)]
        whole = one.host_batch(step, 0)
        queries = [q for b in shares for q in two.model.texts(b.queries["input_ids"])]
        documents = [d for b in shares for d in two.model.texts(b.documents["input_ids"])]
        assert queries == one.model.texts(whole.queries["input_ids"])
        assert documents == one.model.texts(whole.documents["input_ids"])
        for k, query in enumerate(queries):
            assert documents[4 * k : 4 * k + 4] == [f"p{query[1:]}"] + [f"n{j} of {query[1:]}" for j in range(3)]


def test_arrow_copy_is_reused_and_rebuilt_when_the_source_changes(tmp_path):
    path = write_triplets(tmp_path / "t.jsonl", 10)
    cache = tmp_path / "cache"
    first = load_rows(DataSource(path=str(path)), False, cache)
    arrows = list(cache.rglob("rows.arrow"))
    assert len(arrows) == 1 and len(first) == 10
    assert len(load_rows(DataSource(path=str(path)), False, cache)) == 10 and list(cache.rglob("rows.arrow")) == arrows
    rows = [json.loads(line) for line in path.read_text().splitlines()][:4]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert len(load_rows(DataSource(path=str(path)), False, cache)) == 4
    assert len(list(cache.rglob("rows.arrow"))) == 2


@pytest.mark.slow
def test_local_job_with_model_from_s3_and_data_over_http(s3, files, tmp_path, tiny_model):
    """`colbert-k8s local` end to end: each pod stages the model (S3 prefix) and data (HTTP) itself."""
    import os
    import subprocess

    import yaml

    from tests.helpers import ROOT

    server, _ = files
    s3.bucket("e2e-models")
    s3.put_dir("e2e-models", "tiny", tiny_model)
    cfg = {
        "model": {"name_or_path": "s3://e2e-models/tiny/", "query_length": 16, "document_length": 48},
        "data": {"train": {"path": f"{server.url}/train.jsonl"}},
        "training": {"per_device_batch_size": 4, "max_steps": 2},
        "evaluation": {"after_training": False},
        "output_dir": "output",
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(cfg))
    flags = ("--nodes", "2", "--pod-local-storage", "-v", *s3_flags(s3.url))
    cmd = local_command(tmp_path / "train.yaml", "remote", tmp_path / "wd", *flags)
    env = {**os.environ, **s3.env}
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "job remote succeeded: 2 steps" in res.stdout
    assert "testing-secret" not in res.stdout + res.stderr
    for pod in ("remote-master-0", "remote-worker-0"):
        ws = tmp_path / "wd" / "pods" / pod
        assert len(list((ws / ".cache" / "colbert-k8s" / "sources").glob("*/.complete"))) == 2  # model + data
        assert f"[{pod.removeprefix('remote-')}]" in res.stdout
    assert "staged s3://e2e-models/tiny/" in res.stdout and f"staged {server.url}/train.jsonl" in res.stdout


def test_mine_model_and_teacher_on_s3_are_staged_like_the_model(s3_env, tmp_path, tiny_model):
    """Every model a job reads may sit in object storage: model.name_or_path, mine.model, mine.teacher."""
    from trainer.config.load import parse_config
    from trainer.storage.sources import stage_config

    s3_env.bucket("models")
    s3_env.put_dir("models", "retriever", tiny_model)
    s3_env.put_dir("models", "teacher", tiny_model)
    cfg = parse_config(
        {
            "data": {"train": {"path": "t.jsonl"}, "cache_dir": str(tmp_path / "cache")},
            "training": {"max_steps": 1},
            "loss": {"name": "distillation"},
            "mine": {"model": "s3://models/retriever/", "teacher": {"name_or_path": "s3://models/teacher"}},
        }
    )
    staged = stage_config(cfg)
    for path in (staged.mine.model, staged.mine.teacher.name_or_path):
        assert (Path(path) / "config.json").read_bytes() == (tiny_model / "config.json").read_bytes()
    assert staged.mine.model != staged.mine.teacher.name_or_path
