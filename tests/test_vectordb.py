"""The corpus into a vector database (``trainer/vectordb.py``, ``trainer/destinations/{qdrant,lance,milvus,claim}.py``,
``colbert-k8s export-index``), against the real embedded databases: Qdrant's local mode, LanceDB on disk and
Milvus Lite.

Written, searched and held to exact MaxSim computed here with numpy; killed after a partial write and resumed
with no point twice; a collection this tool did not make refused, and replaced only when told; a bad URL, a key
that would travel in clear, a refused key and a redirect each one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from operator_cli.cli import cli
from tests.helpers import ROOT
from tests.helpers.vectordb import Answering, exact_top, save_colbert, write_corpus

pytest.importorskip("qdrant_client", reason="the vectordb extra: scripts/setup.sh train,test installs it")
pytest.importorskip("lancedb", reason="the vectordb extra: scripts/setup.sh train,test installs it")
pytest.importorskip("pymilvus", reason="the vectordb extra: scripts/setup.sh train,test installs it")
pytest.importorskip("milvus_lite", reason="the vectordb extra: scripts/setup.sh train,test installs it")

from trainer.destinations.base import ExportError  # noqa: E402
from trainer.destinations.vectors import database, parse_vector_url  # noqa: E402

URLS = {
    "qdrant": "qdrant+local://{root}/qdrant?collection={name}",
    "lancedb": "lancedb://{root}/lance?table={name}",
    "milvus": "milvus+local://{root}/milvus.db?collection={name}",
}
DOCUMENTS, CHUNK = 40, 16


@pytest.fixture(scope="module")
def beir(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("beir"), DOCUMENTS)


@pytest.fixture(scope="module")
def colbert(tiny_model, tmp_path_factory):
    from pylate import models

    path = save_colbert(tiny_model, tmp_path_factory.mktemp("colbert") / "model")
    return path, models.ColBERT(str(path))


def _url(db: str, root: Path, name: str = "docs") -> str:
    return URLS[db].format(root=root, name=name)


def _export(colbert, beir: Path, url: str, **options) -> dict:
    from trainer.vectordb import export_corpus, fingerprint

    path, model = colbert
    target = parse_vector_url(url)
    return export_corpus(
        model, beir / "corpus.jsonl", target, fingerprint(path), queries=beir, chunk_size=CHUNK, **options
    )


def _searched(colbert, beir: Path, url: str) -> list[list[str]]:
    """Each judged query's top 10 as the database answers it, asked here, not through the export's own check."""
    _, model = colbert
    queries = [json.loads(line)["text"] for line in (beir / "queries.jsonl").read_text().splitlines()]
    db = database(parse_vector_url(url))
    try:
        db.existing()
        return [[d for d, _ in db.search(q, 10)] for q in model.encode(queries, is_query=True, show_progress_bar=False)]
    finally:
        db.close()


def _rows(url: str) -> list[dict]:
    """Every point the collection holds, as (doc_id and the fields written), read with the database's client;
    Milvus: each document's first row (its fields; a collection of another program's: every row)."""
    target = parse_vector_url(url)
    if target.db == "milvus":
        return [{"doc_id": r["doc_id"], **(r.get("fields") or {})} for r in _milvus_rows(url) if not r.get("token")]
    if target.db == "qdrant":
        from qdrant_client import QdrantClient

        client = QdrantClient(path=target.path)
        try:
            points, _ = client.scroll(target.collection, limit=10_000, with_payload=True)
            return [p.payload for p in points]
        finally:
            client.close()
    import lancedb

    table = lancedb.connect(target.path).open_table(target.collection)
    return table.to_arrow().drop_columns(["vector"]).to_pylist()


@pytest.mark.parametrize("db", list(URLS))
def test_the_corpus_is_written_searched_and_held_to_exact_maxsim(tmp_path, beir, colbert, db):
    url = _url(db, tmp_path)
    result = _export(colbert, beir, url)
    points = _points(db, colbert, beir)
    assert (result["state"], result["documents"], result["written"], result["points"]) == ("created", 40, 40, points)
    parity = result["parity"]
    assert parity["queries"] == 8 and parity["overlap@10"] == 1.0 and parity["same_order"] == 1.0
    assert parity["ndcg@10_database"] == parity["ndcg@10_exact"] and parity["max_score_difference"] < 1e-3
    assert _searched(colbert, beir, url) == exact_top(colbert[1], beir)  # numpy's MaxSim, not the export's
    rows = {r["doc_id"]: r for r in _rows(url)}
    first = json.loads((beir / "corpus.jsonl").read_text().splitlines()[0])
    assert len(rows) == 40 and rows[first["_id"]]["title"] == "title 0"
    row = rows[first["_id"]]
    other = json.loads(row["fields"]) if db == "lancedb" else row  # LanceDB: the other fields as one JSON column
    assert other["metadata"] == first["metadata"]


@pytest.mark.parametrize("db", list(URLS))
def test_pooled_vectors_are_fewer_and_still_searched_as_exact_maxsim(tmp_path, beir, colbert, db):
    whole = _export(colbert, beir, _url(db, tmp_path, "whole"))
    url = _url(db, tmp_path, "pooled")
    pooled = _export(colbert, beir, url, pool_factor=2)
    assert pooled["tokens_per_document"] < 0.75 * whole["tokens_per_document"]
    assert pooled["vector_bytes_per_document"] < whole["vector_bytes_per_document"]
    assert pooled["parity"]["overlap@10"] == 1.0
    assert _searched(colbert, beir, url) == exact_top(colbert[1], beir, pool_factor=2)


def _milvus_rows(url: str) -> list[dict]:
    """Every row of a Milvus Lite collection, read with pymilvus's own query iterator (no vectors)."""
    from milvus_lite.server_manager import server_manager_instance
    from pymilvus import MilvusClient

    target = parse_vector_url(url)
    client = MilvusClient(target.path)
    try:
        client.load_collection(target.collection)
        rows, found = client.query_iterator(target.collection, batch_size=1000, output_fields=["*"]), []
        while page := rows.next():
            found += [{k: v for k, v in r.items() if k != "vector"} for r in page]
        rows.close()
        return found
    finally:
        client.close()
        server_manager_instance.release_server(target.path)


def _token_counts(colbert, beir: Path) -> dict[str, int]:
    """Each document's token vectors, as PyLate encodes it here."""
    rows = [json.loads(line) for line in (beir / "corpus.jsonl").read_text().splitlines()]
    texts = [f"{d['title']} {d['text']}" if d.get("title") else d["text"] for d in rows]
    vectors = colbert[1].encode(texts, is_query=False, show_progress_bar=False)
    return {d["_id"]: len(v) for d, v in zip(rows, vectors)}


def _points(db: str, colbert, beir: Path) -> int:
    """The points a whole export holds: a document each (Qdrant, LanceDB); a token vector each (Milvus)."""
    return sum(_token_counts(colbert, beir).values()) if db == "milvus" else DOCUMENTS


def _interrupt_after_first_write(monkeypatch, db: str) -> None:
    """The database's own write runs once, whole; then the run is interrupted, as a kill would stop it."""
    from trainer.destinations.lance import LanceTable
    from trainer.destinations.milvus import MilvusCollection
    from trainer.destinations.qdrant import QdrantCollection

    cls = {"qdrant": QdrantCollection, "lancedb": LanceTable, "milvus": MilvusCollection}[db]
    real = cls.write

    def write_then_stop(self, *args):
        real(self, *args)
        raise KeyboardInterrupt

    monkeypatch.setattr(cls, "write", write_then_stop)


@pytest.mark.parametrize("db", list(URLS))
def test_an_interrupted_write_resumes_without_writing_a_point_twice(tmp_path, beir, colbert, db, monkeypatch):
    url = _url(db, tmp_path)
    with monkeypatch.context() as m:
        _interrupt_after_first_write(m, db)
        with pytest.raises(KeyboardInterrupt):
            _export(colbert, beir, url)
    assert len(_rows(url)) == CHUNK
    result = _export(colbert, beir, url)
    points = _points(db, colbert, beir)
    assert (result["state"], result["written"], result["already_there"], result["points"]) == (
        "resumed",
        DOCUMENTS - CHUNK,
        CHUNK,
        points,
    )
    ids = [r["doc_id"] for r in _rows(url)]
    assert len(ids) == len(set(ids)) == DOCUMENTS
    again = _export(colbert, beir, url)
    assert (again["written"], again["points"]) == (0, points)


_KILLED = """
import os, signal, sys
from pathlib import Path
from pylate import models
from trainer.destinations.lance import LanceTable
from trainer.destinations.milvus import MilvusCollection
from trainer.destinations.qdrant import QdrantCollection
from trainer.destinations.vectors import parse_vector_url
from trainer.vectordb import export_corpus, fingerprint

model_dir, beir, url = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
for cls in (LanceTable, MilvusCollection, QdrantCollection):
    real = cls.write
    def write_then_die(self, *args, real=real):
        real(self, *args)
        os.kill(os.getpid(), signal.SIGKILL)  # no finally, no close: the embedded database's lock is left as is
    cls.write = write_then_die
export_corpus(models.ColBERT(str(model_dir)), beir / "corpus.jsonl", parse_vector_url(url), fingerprint(model_dir),
              chunk_size=16)
"""


@pytest.mark.slow
@pytest.mark.parametrize("db", list(URLS))
def test_a_killed_process_leaves_what_it_wrote_and_the_rerun_completes_it(tmp_path, beir, colbert, db):
    """SIGKILL after the first chunk's write: the database holds that chunk whole, and a new process (the
    embedded database's lock released with the killed one) writes the rest, nothing twice."""
    url = _url(db, tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _KILLED, str(colbert[0]), str(beir), url], env=env, capture_output=True, timeout=600
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    assert len(_rows(url)) == CHUNK
    result = _export(colbert, beir, url)
    points = _points(db, colbert, beir)
    assert (result["state"], result["written"], result["points"]) == ("resumed", DOCUMENTS - CHUNK, points)
    ids = [r["doc_id"] for r in _rows(url)]
    assert len(ids) == len(set(ids)) == DOCUMENTS


def _foreign(db: str, url: str) -> None:
    """A collection another program made, with one point of its own (no colbert-k8s marker)."""
    target = parse_vector_url(url)
    if db == "milvus":
        from milvus_lite.server_manager import server_manager_instance
        from pymilvus import MilvusClient

        client = MilvusClient(target.path)
        client.create_collection(target.collection, dimension=4)  # Milvus's quick set-up: id, vector, dynamic
        client.insert(target.collection, [{"id": 1, "vector": [1.0, 0, 0, 0], "doc_id": "theirs"}])
        client.close()
        server_manager_instance.release_server(target.path)
        return
    if db == "qdrant":
        from qdrant_client import QdrantClient, models

        client = QdrantClient(path=target.path)
        client.create_collection(target.collection, vectors_config=models.VectorParams(size=4, distance="Cosine"))
        client.upsert(target.collection, [models.PointStruct(id=1, vector=[1, 0, 0, 0], payload={"doc_id": "theirs"})])
        client.close()
        return
    import lancedb

    lancedb.connect(target.path).create_table(target.collection, data=[{"doc_id": "theirs", "vector": [1.0, 0.0]}])


@pytest.mark.parametrize("db", list(URLS))
def test_a_collection_this_tool_did_not_make_is_refused_unless_replace(tmp_path, beir, colbert, db):
    url = _url(db, tmp_path)
    _foreign(db, url)
    with pytest.raises(ExportError) as refused:
        _export(colbert, beir, url)
    said = str(refused.value)
    assert "exists and was not made by colbert-k8s" in said and "replace" in said and "\n" not in said
    assert [r["doc_id"] for r in _rows(url)] == ["theirs"]  # untouched
    result = _export(colbert, beir, url, replace=True)
    assert (result["state"], result["points"]) == ("replaced", _points(db, colbert, beir))
    assert "theirs" not in {r["doc_id"] for r in _rows(url)}
    with pytest.raises(ExportError, match=r"holds another export \(pool_factor 1\); name a new"):
        _export(colbert, beir, url, pool_factor=2)  # this tool's, but of other vectors: not mixed in
    assert _export(colbert, beir, url, replace=True)["state"] == "resumed"  # its own: resumed, never dropped


def _job(tmp_path: Path, beir: Path, url: str, replace: bool = False):
    from trainer.config.load import parse_config

    return parse_config(
        {
            "data": {"train": {"path": "t.jsonl"}, "eval_beir": str(beir)},
            "training": {"max_steps": 1},
            "vectordb": {"destination": url, "replace": replace, "chunk_size": CHUNK},
            "output_dir": str(tmp_path / "output"),
        }
    )


def test_the_job_checks_the_collection_at_start_and_writes_it_after_training(tmp_path, beir, colbert):
    """preflight: a collection that exists before the job trained is not its own (refused, one line); the phase
    writes the corpus, metrics.json and the card record the check; once trained, a restart's preflight passes."""
    from trainer import phases
    from trainer.destinations.claim import preflight
    from trainer.run.checkpoint import write_manifest

    url = _url("qdrant", tmp_path)
    cfg = _job(tmp_path, beir, url)
    preflight(cfg)  # nothing there yet
    _export(colbert, beir, url)  # an earlier job's export into the same collection
    with pytest.raises(ExportError, match="holds an export this job did not write; name a new collection, or set"):
        preflight(cfg)
    preflight(_job(tmp_path, beir, url, replace=True))
    url = _url("qdrant", tmp_path, "job")
    cfg = _job(tmp_path, beir, url)
    out = Path(cfg.output_dir)
    from shutil import copytree

    copytree(colbert[0], out / "final-model")
    write_manifest(out / "final-model")
    (out / "metrics.json").write_text(json.dumps({"steps": 1, "model_dir": str(out / "final-model")}))
    assert phases.redo_from(cfg)[0] == "vectordb"
    phases.finish(cfg, json.loads((out / "metrics.json").read_text()))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["vectordb"]["points"] == DOCUMENTS and metrics["vectordb"]["parity"]["overlap@10"] == 1.0
    card = (out / "final-model" / "README.md").read_text()
    assert "## In a vector database" in card and "| nDCG@10 |" in card and str(tmp_path) not in card
    assert phases.redo_from(cfg) == (None, "")
    preflight(cfg)  # the restart of a trained job: its own collection


@pytest.mark.parametrize(
    "url,said",
    [
        ("qdrant://key:s3cret@db.example/docs", "holds credentials (not shown)"),
        ("qdrant://db.example/docs?api_key=s3cret", "takes no api_key in its query"),
        ("qdrant+local://relative/dir?collection=docs", "needs an absolute path"),
        ("lancedb:///srv/lance", "names no table: add ?table=NAME"),
        ("qdrant://db.example/a/b", "must name one collection"),
        ("weaviate://db.example/docs", "weaviate:// is not a vector database destination"),
        ("milvus://root:s3cret@db.example/docs", "key comes from the environment: MILVUS_TOKEN"),
        ("milvus://db.example/docs?token=s3cret", "takes no token in its query"),
        ("milvus+local://relative/m.db?collection=docs", "needs an absolute path: milvus+local:///ABS/PATH.db?"),
        ("milvus+local:///srv/milvus.db", "names no collection: add ?collection=NAME"),
        ("milvus+local:///srv/milvus?collection=docs", "needs a path ending in .db"),
        ("milvus://db.example/nf-corpus", "milvus takes letters, digits and '_' only"),
    ],
    ids=[
        "userinfo",
        "key-in-query",
        "relative-path",
        "no-table",
        "two-names",
        "unknown-scheme",
        "milvus-userinfo",
        "milvus-token-in-query",
        "milvus-relative-path",
        "milvus-no-collection",
        "milvus-not-db",
        "milvus-name",
    ],
)
def test_a_bad_url_is_one_line_naming_the_fix_and_never_the_secret(tmp_path, url, said):
    res = CliRunner().invoke(cli, ["export-index", str(tmp_path), "--corpus", str(tmp_path), "--to", url])
    assert res.exit_code == 2 and said in res.output and "s3cret" not in res.output, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) <= 2  # error: and hint:


def test_a_key_never_travels_in_clear_and_a_refused_key_is_one_line(tmp_path, monkeypatch):
    """QDRANT_API_KEY over plain HTTP is refused before any request; a server that refuses the key (HTTP 401),
    or answers with a redirect (never followed: the key would go elsewhere), is one line."""
    from trainer.destinations.qdrant import QdrantCollection

    server = Answering(401)
    try:
        url = f"qdrant+http://127.0.0.1:{server.port}/docs"
        monkeypatch.setenv("QDRANT_API_KEY", "k3y")
        with pytest.raises(ExportError, match="QDRANT_API_KEY would travel in clear over plain HTTP"):
            QdrantCollection(parse_vector_url(url))
        assert server.keys == []
        monkeypatch.delenv("QDRANT_API_KEY")
        with pytest.raises(ExportError, match=r"answered HTTP 401 at listing collections: it needs QDRANT_API_KEY"):
            QdrantCollection(parse_vector_url(url)).existing()
    finally:
        server.close()
    server = Answering(302, location="https://login.example/")
    try:
        db = QdrantCollection(parse_vector_url(f"qdrant+http://127.0.0.1:{server.port}/docs"))
        with pytest.raises(ExportError, match=r"a redirect \(HTTP 302 to https://login.example/\).*no redirect is"):
            db.existing()
        assert len(server.keys) == 1  # asked once, not followed
    finally:
        server.close()


def test_export_index_runs_the_trainer_here_and_without_torch_names_the_extra(tmp_path, beir, colbert):
    url = _url("lancedb", tmp_path)
    res = CliRunner().invoke(cli, ["export-index", str(colbert[0]), "--corpus", str(beir), "--to", url])
    assert res.exit_code == 0, res.output
    assert "40 documents in lancedb://" in res.output and "top 10 shared with exact MaxSim 100.0%" in res.output
    res = CliRunner().invoke(cli, ["export-index", str(colbert[0]), "--corpus", str(beir), "--to", url])
    assert res.exit_code == 0 and "(0 written, resumed)" in res.output
    code = (
        "import sys\n"
        "sys.modules['torch'] = sys.modules['pylate'] = None\n"  # as where the train extra is not installed
        "from operator_cli.cli import main\n"
        f"sys.argv = ['colbert-k8s', 'export-index', 'm', '--corpus', 'c', '--to', {url!r}]\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "needs torch, pylate" in done.stderr, done.stderr
    assert "pip install 'colbert-k8s[train,vectordb]'" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_lancedb_in_an_object_store_takes_its_credentials_from_the_environment(tmp_path, beir, colbert, monkeypatch):
    """``lancedb+s3://`` against moto's S3 server: the same write, check and resume; the credentials and the
    endpoint only from the environment, as the object-store destinations take theirs; a missing bucket is one
    line."""
    from tests.helpers.stores import MOTO_SERVER, MotoS3

    if not MOTO_SERVER.is_file():
        pytest.skip(".venv-moto (moto's S3 server) is absent: scripts/setup.sh train,test creates it")
    s3 = MotoS3()
    try:
        s3.bucket("vectors")
        for key, value in {**s3.env, "AWS_ALLOW_HTTP": "true"}.items():
            monkeypatch.setenv(key, value)
        url = "lancedb+s3://vectors/search?table=docs"
        result = _export(colbert, beir, url)
        assert (result["state"], result["points"], result["parity"]["overlap@10"]) == ("created", DOCUMENTS, 1.0)
        assert _export(colbert, beir, url)["written"] == 0
        with pytest.raises(ExportError) as missing:
            _export(colbert, beir, "lancedb+s3://no-such-bucket/search?table=docs")
        said = str(missing.value)
        gone = "lancedb+s3://no-such-bucket/search?table=docs: opening the database was refused"
        assert said == f"{gone} (the bucket does not exist)"
        assert "testing-secret" not in said
    finally:
        s3.proc.terminate()
        s3.proc.wait()


def _milvus_tokens(url: str) -> dict[str, list[int]]:
    """Each document's token positions as Milvus holds them, sorted: a document written once holds 0..n-1."""
    found: dict[str, list[int]] = {}
    for row in _milvus_rows(url):
        found.setdefault(row["doc_id"], []).append(row["token"])
    return {d: sorted(t) for d, t in found.items()}


def test_milvus_a_document_cut_mid_write_is_rewritten_whole(tmp_path, beir, colbert, monkeypatch):
    """Milvus holds a row per token vector, so a write can stop inside a document: the restart finds that
    document's rows incomplete, deletes them and writes it again whole; no row is there twice."""
    import trainer.destinations.milvus as milvus

    url = _url("milvus", tmp_path)
    monkeypatch.setattr(milvus, "_FLOATS_PER_REQUEST", 1000)  # an insert of 8 of the 128-float vectors
    real, calls = milvus.MilvusCollection._insert, []

    def insert_then_stop(self, rows):
        calls.append(len(rows))
        real(self, rows)
        if len(calls) == 3:
            raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(milvus.MilvusCollection, "_insert", insert_then_stop)
        with pytest.raises(KeyboardInterrupt):
            _export(colbert, beir, url)
    counts = _token_counts(colbert, beir)
    cut = _milvus_tokens(url)
    assert sum(map(len, cut.values())) == sum(calls) == 24
    assert [d for d, t in cut.items() if len(t) < counts[d]]  # a document stopped part way
    result = _export(colbert, beir, url)
    assert (result["state"], result["points"]) == ("resumed", sum(counts.values()))
    tokens = _milvus_tokens(url)
    assert tokens == {d: list(range(n)) for d, n in counts.items()}  # every token vector once, none missing


def test_milvus_search_is_approximate_in_its_candidates_and_exact_in_its_scores(tmp_path, beir, colbert, monkeypatch):
    """ColBERT's two stages, held to a numpy reference: the candidates are the documents owning some query token's
    ``limit`` nearest token vectors (Milvus Lite's index is exact here), and the answer is the candidates' best by
    MaxSim over all their vectors, with those scores. With one hit a token (``limit`` = max(TOKEN_HITS, k // 2)) a
    document of the exact top k is missed: the search is approximate by construction, and the reference says
    which."""
    import numpy as np

    import trainer.destinations.milvus as milvus

    url = _url("milvus", tmp_path)
    assert _export(colbert, beir, url)["parity"]["overlap@10"] == 1.0  # 64 hits a token: every top 10 found
    monkeypatch.setattr(milvus, "TOKEN_HITS", 1)
    parity = _export(colbert, beir, url)["parity"]  # the export's own check, at k 10: 5 hits a token
    model = colbert[1]
    rows = [json.loads(line) for line in (beir / "corpus.jsonl").read_text().splitlines()]
    texts = [f"{d['title']} {d['text']}" if d.get("title") else d["text"] for d in rows]
    docs = [np.asarray(v) for v in model.encode(texts, is_query=False, show_progress_bar=False)]
    owner = np.concatenate([np.full(len(v), i) for i, v in enumerate(docs)])  # each token vector's document
    every = np.concatenate(docs)
    queries = [json.loads(line)["text"] for line in (beir / "queries.jsonl").read_text().splitlines()]
    missed, overlap = 0, []
    db = database(parse_vector_url(url))
    try:
        db.existing()
        for query in model.encode(queries, is_query=True, show_progress_bar=False):
            q = np.asarray(query)
            maxsim = [float((q @ d.T).max(axis=1).sum()) for d in docs]
            for k in (2, 10):
                nearest = np.argsort(-(q @ every.T), axis=1)[:, : max(1, k // 2)]
                candidates = sorted(set(owner[nearest.ravel()].tolist()), key=lambda i: -maxsim[i])[:k]
                found = db.search(query, k)
                assert [d for d, _ in found] == [rows[i]["_id"] for i in candidates]
                assert np.allclose([s for _, s in found], [maxsim[i] for i in candidates], atol=1e-4)
                exact = set(np.argsort(maxsim)[::-1][:k].tolist())
                missed += len(exact - set(candidates))
                if k == 10:
                    overlap.append(len(exact & set(candidates)) / k)
    finally:
        db.close()
    assert missed > 0  # the approximation is real: documents of the exact top k were never candidates
    # the export's check says what the reference says: its overlap, and exact scores for what it found
    assert parity["overlap@10"] == round(sum(overlap) / len(overlap), 4) and parity["max_score_difference"] < 1e-5


def test_milvus_token_never_travels_in_clear_and_a_refused_token_is_one_line(monkeypatch):
    """MILVUS_TOKEN over milvus+http:// is refused before any call; a server that refuses the caller
    (UNAUTHENTICATED) is one line naming MILVUS_TOKEN; a server that does not answer is one line (exit 150's
    ExportFailed); none of them shows the token."""
    import socket

    from tests.helpers.vectordb import RefusingMilvus
    from trainer.destinations.base import ExportFailed
    from trainer.destinations.milvus import MilvusCollection

    server = RefusingMilvus()
    try:
        url = f"milvus+http://127.0.0.1:{server.port}/docs"
        monkeypatch.setenv("MILVUS_TOKEN", "root:s3cret")
        with pytest.raises(ExportError) as clear:
            MilvusCollection(parse_vector_url(url))
        assert "MILVUS_TOKEN would travel in clear over plain HTTP; use milvus:// (TLS)" in str(clear.value)
        assert server.calls == []
        monkeypatch.delenv("MILVUS_TOKEN")
        with pytest.raises(ExportError) as refused:
            MilvusCollection(parse_vector_url(url))
        said = str(refused.value)
        assert "refused connecting (UNAUTHENTICATED): it needs MILVUS_TOKEN; pass a valid token with" in said
        assert "\n" not in said and server.calls and all(auth is None for _, auth in server.calls)
    finally:
        server.close()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MILVUS_TOKEN", "root:s3cret")
    with pytest.raises(ExportFailed) as down:
        MilvusCollection(parse_vector_url(f"milvus://127.0.0.1:{port}/docs"))
    said = str(down.value)
    assert said.startswith(f"milvus://127.0.0.1:{port}/docs: the server cannot be reached (Fail connecting")
    assert "s3cret" not in said and "\n" not in said


_TLS_CLIENT = """
import os, sys
from trainer.destinations.base import ExportError
from trainer.destinations.milvus import MilvusCollection
from trainer.destinations.vectors import parse_vector_url
try:
    MilvusCollection(parse_vector_url(sys.argv[1]))
except ExportError as e:
    print(e)
"""


@pytest.mark.slow
def test_milvus_token_goes_over_tls_to_the_named_server_and_a_refusal_never_shows_it(tmp_path):
    """milvus:// is gRPC over TLS: the token reaches the server the URL names (trusted here through gRPC's
    GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, in a process of its own), and its refusal is one line without it."""
    import base64

    import trustme

    from tests.helpers.vectordb import RefusingMilvus

    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    server = RefusingMilvus(cert=ca.issue_cert("127.0.0.1"))
    try:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "MILVUS_TOKEN": "root:s3cret",
            "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(tmp_path / "ca.pem"),
        }
        url = f"milvus://127.0.0.1:{server.port}/docs"
        done = subprocess.run(
            [sys.executable, "-c", _TLS_CLIENT, url], env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        server.close()
    said = done.stdout.strip()
    assert done.returncode == 0 and said.startswith(f"{url}: the server refused connecting (UNAUTHENTICATED)"), done
    assert "MILVUS_TOKEN was refused" in said and "\n" not in said and "Traceback" not in done.stderr
    sent = {auth for _, auth in server.calls}
    assert sent == {base64.b64encode(b"root:s3cret").decode()}  # the token went to the named server
    assert "s3cret" not in said + done.stderr and base64.b64encode(b"root:s3cret").decode() not in said


def test_milvus_lite_open_in_another_process_is_one_line(tmp_path):
    """Milvus Lite takes its directory's lock (flock on LOCK): a second process is refused in one line."""
    from trainer.destinations.milvus import MilvusCollection

    url = _url("milvus", tmp_path)
    MilvusCollection(parse_vector_url(url)).close()  # the database made, its lock released
    hold = "import fcntl, sys; f = open(sys.argv[1], 'rb'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True)"
    holder = subprocess.Popen(
        [sys.executable, "-c", hold + "; sys.stdin.read()", str(tmp_path / "milvus.db" / "LOCK")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ExportError) as locked:
            MilvusCollection(parse_vector_url(url))
        said = str(locked.value)
        assert said == f"{url}: {tmp_path}/milvus.db is open in another process; Milvus Lite takes one at a time " + (
            "(close it, or use a Milvus server)"
        )
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    MilvusCollection(parse_vector_url(url)).close()  # released with the other process
