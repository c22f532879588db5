"""Serving (trainer/serve/, ``colbert-k8s serve --local``): the predictor, over real HTTP, answers as the trainer
measures. Exact search gives the evaluation's own top-10 (``trainer/evaluate.py`` ``search``), PLAID search the
index's own answer, rerank the model's MaxSim called directly; every bad request is a 400 and one line, and the
server goes on serving. The server runs in .venv-serve (kserve); its tests skip, saying why, without it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT
from tests.helpers.serving import SERVE_PYTHON, SKIP_REASON, Predictor, served_output
from trainer.serve.requests import MAX_BODY, BadRequest, Rerank, Search, parse_v1, parse_v2

needs_kserve = pytest.mark.skipif(not SERVE_PYTHON.exists(), reason=SKIP_REASON)

# ---- what a client may ask --------------------------------------------------------------------------------

BAD_V1 = [
    ("not an object", [1], "must be a JSON object"),
    ("no instances", {"queries": []}, 'with "instances"'),
    ("empty instances", {"instances": []}, "instances is empty"),
    ("empty query", {"instances": [{"query": "  ", "k": 3}]}, "instances[0].query is empty"),
    ("query not text", {"instances": [{"query": 3}]}, "instances[0].query must be a string"),
    ("k zero", {"instances": [{"query": "q", "k": 0}]}, "k must be from 1 to 1000, got 0"),
    ("k huge", {"instances": [{"query": "q", "k": 10**9}]}, "k must be from 1 to 1000, got 1000000000"),
    ("k a string", {"instances": [{"query": "q", "k": "10"}]}, "k must be an integer"),
    ("k a bool", {"instances": [{"query": "q", "k": True}]}, "k must be an integer"),
    ("two ks", {"instances": [{"query": "a", "k": 1}, {"query": "b", "k": 2}]}, "different k"),
    ("unknown field", {"instances": [{"query": "q", "top": 3}]}, "unknown field 'top'"),
    ("rerank no texts", {"instances": [{"query": "q", "documents": []}]}, "non-empty list of texts"),
    ("rerank and k", {"instances": [{"query": "q", "documents": ["a"], "k": 2}]}, "one instance with query and"),
    ("too many", {"instances": [{"query": "q"}] * 65}, "at most 64"),
]


@pytest.mark.parametrize("name,payload,message", BAD_V1, ids=[b[0] for b in BAD_V1])
def test_a_bad_v1_request_is_one_line_naming_the_field(name, payload, message):
    with pytest.raises(BadRequest) as e:
        parse_v1(payload)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "inputs,want",
    [
        ({"query": ["a", "b"], "k": [5]}, Search(["a", "b"], 5)),
        ({"query": ["a"]}, Search(["a"], 10)),
        ({"query": ["a"], "documents": ["x", "y"]}, Rerank("a", ["x", "y"])),
    ],
    ids=["search", "default k", "rerank"],
)
def test_v2_tensors_read_as_v1_instances(inputs, want):
    assert parse_v2(inputs) == want


@pytest.mark.parametrize(
    "inputs,message",
    [
        ({"k": [3]}, 'tensor "query" .BYTES. is missing'),
        ({"query": ["a"], "k": [0]}, "k must be from 1"),
        ({"query": ["a"], "k": [1, 2]}, "one value"),
        ({"query": ["a"], "topk": [1]}, "unknown input tensor 'topk'"),
    ],
    ids=["no query", "k zero", "two ks", "unknown"],
)
def test_a_bad_v2_request_is_one_line(inputs, message):
    with pytest.raises(BadRequest, match=message):
        parse_v2(inputs)


# ---- the engine, against the trainer's own evaluation -----------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model):
    """A job's output_dir with a final model and its index (corpus embeddings stored), and the model and split."""
    from pylate import models

    from trainer.evaluate import load_beir

    root = tmp_path_factory.mktemp("served")
    out = served_output(root, tiny_model)
    return out, models.ColBERT(str(out / "final-model")), load_beir(root / "beir")


@pytest.mark.slow
def test_exact_search_is_the_evaluations_search(served):
    """Engine's exact top-10, in order, with the scores, equals trainer/evaluate.py's for every query."""
    from trainer.evaluate import search, trec_order
    from trainer.serve.engine import Engine, locate

    out, model, split = served
    want = search(model, split)
    engine = Engine(*locate(str(out), out / "cache"), exact=True, device="cpu")
    got = engine.search(split.queries, 10)
    for qid, (ids, scores) in zip(split.query_ids, got):
        assert ids == trec_order(want[qid])[:10]
        assert scores == pytest.approx([want[qid][i] for i in ids], abs=1e-5)


@pytest.mark.slow
def test_exact_needs_the_stored_embeddings_in_one_line(served, tmp_path):
    import shutil

    from trainer.run.checkpoint import write_manifest
    from trainer.serve import ServeError
    from trainer.serve.corpus import EMBEDDINGS
    from trainer.serve.engine import Engine, locate

    out = tmp_path / "output"
    shutil.copytree(served[0], out)
    (out / "index" / EMBEDDINGS).unlink()
    write_manifest(out / "index")
    with pytest.raises(ServeError, match="--exact needs the corpus embeddings beside the index"):
        Engine(*locate(str(out), tmp_path / "cache"), exact=True, device="cpu")
    (out / "final-model" / "config.json").write_text("{}")  # not the bytes its manifest lists
    with pytest.raises(ServeError, match="the final model .* is not whole"):
        locate(str(out), tmp_path / "cache")


# ---- the predictor, over HTTP ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exact_server(served):
    server = Predictor(str(served[0]), "--exact")
    yield server
    server.close()


@pytest.mark.slow
@needs_kserve
def test_served_exact_search_is_the_evaluations_top_10_in_v1_and_v2(served, exact_server):
    from trainer.evaluate import search, trec_order

    _, model, split = served
    want = search(model, split)
    queries = split.queries[:5]
    status, body = exact_server.v1([{"query": q, "k": 10} for q in queries])
    assert status == 200, body
    for qid, answer in zip(split.query_ids, body["predictions"]):
        assert answer["ids"] == trec_order(want[qid])[:10]
        assert answer["scores"] == pytest.approx([want[qid][i] for i in answer["ids"]], abs=1e-5)
    status, body = exact_server.v2(
        [
            {"name": "query", "shape": [5], "datatype": "BYTES", "data": queries},
            {"name": "k", "shape": [1], "datatype": "INT32", "data": [10]},
        ]
    )
    assert status == 200, body
    outputs = {o["name"]: o for o in body["outputs"]}
    assert outputs["ids"]["shape"] == [5, 10] and outputs["ids"]["datatype"] == "BYTES"
    assert outputs["ids"]["data"][:10] == trec_order(want[split.query_ids[0]])[:10]


@pytest.mark.slow
@needs_kserve
def test_served_rerank_scores_are_the_models_maxsim(served, exact_server):
    """Each score is MaxSim of the query's and that document's PyLate embeddings, each document scored alone."""
    from pylate.scores import colbert_scores

    _, model, split = served
    query, documents = split.queries[0], split.corpus[:7]
    q = model.encode([query], is_query=True, convert_to_tensor=True)
    want = [
        float(colbert_scores(q, d[None])[0, 0]) for d in model.encode(documents, is_query=False, convert_to_tensor=True)
    ]
    status, body = exact_server.v1([{"query": query, "documents": documents}])
    assert status == 200, body
    assert body["predictions"][0]["scores"] == pytest.approx(want, abs=1e-4)
    status, body = exact_server.v2(
        [
            {"name": "query", "shape": [1], "datatype": "BYTES", "data": [query]},
            {"name": "documents", "shape": [7], "datatype": "BYTES", "data": documents},
        ]
    )
    assert status == 200 and body["outputs"][0]["data"] == pytest.approx(want, abs=1e-4)


BAD_HTTP = [
    ("malformed JSON v1", "/v1/models/colbert:predict", b'{"instances": [', "Unrecognized request format"),
    ("malformed JSON v2", "/v2/models/colbert/infer", b'{"inputs": [', "not valid JSON"),
    ("empty query", "/v1/models/colbert:predict", b'{"instances": [{"query": ""}]}', "query is empty"),
    ("k 0", "/v1/models/colbert:predict", b'{"instances": [{"query": "q", "k": 0}]}', "got 0"),
    ("k 10^9", "/v1/models/colbert:predict", b'{"instances": [{"query": "q", "k": 1000000000}]}', "got 1000000000"),
    (
        "v2 k 0",
        "/v2/models/colbert/infer",
        b'{"inputs": [{"name": "query", "shape": [1], "datatype": "BYTES", "data": ["q"]},'
        b' {"name": "k", "shape": [1], "datatype": "INT32", "data": [0]}]}',
        "got 0",
    ),
    ("10 MB body", "/v1/models/colbert:predict", b"x" * (10 << 20), f"at most {MAX_BODY}"),
]


@pytest.mark.slow
@needs_kserve
@pytest.mark.parametrize("name,path,body,message", BAD_HTTP, ids=[b[0] for b in BAD_HTTP])
def test_a_bad_request_is_a_400_and_one_line_and_the_server_goes_on(exact_server, name, path, body, message):
    status, answer = exact_server.post(path, body)
    assert status == 400, answer
    assert message in answer["error"] and "\n" not in answer["error"] and "Traceback" not in answer["error"]
    status, answer = exact_server.v1([{"query": "a query after a bad one", "k": 3}])
    assert status == 200 and len(answer["predictions"][0]["ids"]) == 3
    assert "Traceback" not in exact_server.output()


@pytest.mark.slow
@needs_kserve
def test_served_plaid_search_is_the_indexs_own_answer(served):
    """Index mode answers as the index phase measured it (PyLate's encode, the PLAID index, its scores)."""
    from pylate import indexes

    out, model, split = served
    index = indexes.PLAID(index_folder=str(out / "index"), index_name="colbert", override=False, show_progress=False)
    want = index(model.encode(split.queries[:5], is_query=True), k=10)
    server = Predictor(str(out))
    try:
        status, body = server.v1([{"query": q, "k": 10} for q in split.queries[:5]])
    finally:
        server.close()
    assert status == 200, body
    assert [p["ids"] for p in body["predictions"]] == [[h["id"] for h in hits] for hits in want]
    assert "search of 47 documents by the PLAID index" in server.output()


@pytest.mark.slow
def test_serve_local_refuses_what_it_cannot_serve_in_one_line(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "operator_cli.cli", "serve", "--local", str(tmp_path / "absent")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if not SERVE_PYTHON.exists():
        assert res.returncode == 2 and "no .venv-serve was found" in res.stderr
        return
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip().splitlines() == [
        f"serve: error: {tmp_path / 'absent'} is not a directory; give an "
        "export (s3://BUCKET/PREFIX/) or a job's output_dir"
    ]


def test_doctests():
    import doctest

    from trainer.serve import register, registry, requests

    assert all(doctest.testmod(m).failed == 0 for m in (requests, registry, register))
