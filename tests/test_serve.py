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
from trainer.serve.requests import MAX_BODY, BadRequest, Rerank, Search, parse_v1, parse_v2, v1_answer, v2_outputs

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
    ("k null", {"instances": [{"query": "q", "k": None}]}, "from 1 to 1000, got null"),
    ("k text", {"instances": [{"query": "q", "k": "10"}]}, 'from 1 to 1000, got "10"'),
    ("lone surrogate", {"instances": [{"query": "a\ud800b"}]}, "instances[0].query holds a lone UTF-16 surrogate"),
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


def _tensor(name: str, data: list, datatype: str = "BYTES", shape: list | None = None) -> dict:
    return {"name": name, "shape": [len(data)] if shape is None else shape, "datatype": datatype, "data": data}


@pytest.mark.parametrize(
    "inputs,want",
    [
        ([_tensor("query", ["a", "b"]), _tensor("k", [5], "INT32")], Search(["a", "b"], 5)),
        ([_tensor("query", ["a"])], Search(["a"], 10)),
        ([_tensor("query", ["a"]), _tensor("k", [5], "INT64")], Search(["a"], 5)),
        ([_tensor("query", [["a"], ["b"]], shape=[2, 1])], Search(["a", "b"], 10)),
        ([_tensor("query", [b"a"])], Search(["a"], 10)),
        ([_tensor("query", ["a"]), _tensor("documents", ["x", "y"])], Rerank("a", ["x", "y"])),
    ],
    ids=["search", "default k", "k int64", "nested by shape", "bytes", "rerank"],
)
def test_v2_tensors_read_as_v1_instances(inputs, want):
    assert parse_v2(inputs) == want


BAD_V2 = [
    ("no query", [_tensor("k", [3], "INT32")], 'tensor "query" .BYTES. is missing'),
    ("k zero", [_tensor("query", ["a"]), _tensor("k", [0], "INT32")], "k must be from 1"),
    ("two ks", [_tensor("query", ["a"]), _tensor("k", [1, 2], "INT32")], "one value"),
    ("unknown", [_tensor("query", ["a"]), _tensor("topk", [1], "INT32")], 'unknown input tensor "topk"'),
    ("twice", [_tensor("query", ["a"]), _tensor("query", ["b"])], '"query" is given twice'),
    ("query FP32", [_tensor("query", ["a"], "FP32")], '"query" must be BYTES tensor, got "FP32"'),
    ("k FP32", [_tensor("query", ["a"]), _tensor("k", [2.0], "FP32")], '"k" must be an integer .INT32. tensor'),
    ("k BYTES", [_tensor("query", ["a"]), _tensor("k", ["3"])], '"k" must be an integer .INT32. tensor'),
    ("shape too big", [_tensor("query", ["a"], shape=[7])], r'"query" has the shape \[7\] but 1 values'),
    ("shape too small", [_tensor("query", ["a", "b"], shape=[1])], r"shape \[1\] but 2 values"),
    ("shape negative", [_tensor("query", ["a"], shape=[-1])], "a shape is a list of sizes"),
    ("surrogate query", [_tensor("query", ["\ud800"])], "query.0. holds a lone UTF-16 surrogate at character 0"),
    (
        "surrogate document",
        [_tensor("query", ["q"]), _tensor("documents", ["ok", "x\udfff"])],
        "documents.1. holds a lone UTF-16 surrogate at character 1",
    ),
    ("not UTF-8", [_tensor("query", [b"\xff"])], '"query" holds bytes that are not UTF-8'),
    ("k null", [_tensor("query", ["a"]), _tensor("k", [None], "INT32")], "got null"),
]


@pytest.mark.parametrize("name,inputs,message", BAD_V2, ids=[b[0] for b in BAD_V2])
def test_a_bad_v2_request_is_one_line(name, inputs, message):
    with pytest.raises(BadRequest, match=message) as e:
        parse_v2(inputs)
    assert "\n" not in str(e.value)


def test_v2_rows_are_each_querys_answer_padded_to_k_with_found():
    """Fewer found than k (PLAID's short answers) is said in ``found``; no row is cut to another's length."""
    result = [(["a", "b", "c"], [3.0, 2.0, 1.0]), (["d"], [4.0])]
    outputs = {name: (shape, data) for name, shape, _, data in v2_outputs(Search(["q1", "q2"], 3), result)}
    assert outputs["ids"] == ([2, 3], ["a", "b", "c", "d", "", ""])
    assert outputs["scores"] == ([2, 3], [3.0, 2.0, 1.0, 4.0, 0.0, 0.0])
    assert outputs["found"] == ([2], [3, 1])
    assert v1_answer(Search(["q1", "q2"], 3), result)["predictions"][1] == {"ids": ["d"], "scores": [4.0], "found": 1}


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
def test_a_query_the_model_cuts_is_counted_and_logged(served, caplog):
    """A query longer than the model's query_length is read in part: the engine counts exactly the queries PyLate's
    tokenizer cuts (held to PyLate's own tokenize), logs the first in one line naming both lengths, and says the
    length at start."""
    from trainer.serve.engine import Engine, locate

    out, model, _ = served
    engine = Engine(*locate(str(out), out / "cache"), exact=True, device="cpu")
    length = model.query_length
    assert f"queries read up to {length} tokens" in engine.describe()
    mask = model.tokenizer.mask_token_id
    for n in range(length - 4, length + 2):  # words of one token each: n + 3 tokens with [CLS], [Q] and [SEP]
        query = " ".join(["cell"] * n)
        ids = [i for i in model.tokenize([query], is_query=True)["input_ids"][0].tolist() if i != mask]
        whole = model.tokenizer(query)["input_ids"]
        pylate_cuts = ids != [*whole[:1], ids[1], *whole[1:]]  # PyLate's: [CLS] [Q] the query [SEP], padded
        caplog.clear()
        with caplog.at_level("WARNING", logger="trainer.serve"):
            engine.search([query], 3)
        assert (engine.cut_queries.cut == 1) == pylate_cuts, (n, length)
        if pylate_cuts:
            assert caplog.messages == [next(m for m in caplog.messages if m.startswith(f"a query of {n + 3} tokens"))]
            assert f"cut to the model's {length}" in caplog.messages[0]
            break
        assert not caplog.messages
    assert engine.cut_queries.cut == 1


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


_QUERY = b'{"name": "query", "shape": [1], "datatype": "BYTES", "data": ["q"]}'
_BINARY = b'{"inputs": [{"name": "query", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 5}}]}'
_FORM = {"Content-Type": "application/x-www-form-urlencoded"}  # what KServe reads as the v2 binary extension
BAD_HTTP = [
    ("malformed JSON v1", "/v1/models/colbert:predict", b'{"instances": [', "the body is not valid JSON", {}),
    ("malformed JSON v2", "/v2/models/colbert/infer", b'{"inputs": [', "the body is not valid JSON", {}),
    ("empty query", "/v1/models/colbert:predict", b'{"instances": [{"query": ""}]}', "query is empty", {}),
    ("k 0", "/v1/models/colbert:predict", b'{"instances": [{"query": "q", "k": 0}]}', "got 0", {}),
    ("k 10^9", "/v1/models/colbert:predict", b'{"instances": [{"query": "q", "k": 1000000000}]}', "got 10000", {}),
    ("k null", "/v1/models/colbert:predict", b'{"instances": [{"query": "q", "k": null}]}', "got null", {}),
    (
        "v2 k 0",
        "/v2/models/colbert/infer",
        b'{"inputs": [' + _QUERY + b', {"name": "k", "shape": [1], "datatype": "INT32", "data": [0]}]}',
        "got 0",
        {},
    ),
    (
        "v2 query twice",
        "/v2/models/colbert/infer",
        b'{"inputs": [' + _QUERY + b", " + _QUERY + b"]}",
        '"query" is given twice',
        {},
    ),
    (
        "v2 surrogate query",
        "/v2/models/colbert/infer",
        b'{"inputs": [{"name": "query", "shape": [1], "datatype": "BYTES", "data": ["\\ud800"]}]}',
        "surrogate",
        {},
    ),
    (
        "v2 surrogate document",
        "/v2/models/colbert/infer",
        b'{"inputs": [' + _QUERY + b', {"name": "documents", "shape": [1], "datatype": "BYTES", "data": ["\\ud800"]}]}',
        "surrogate",
        {},
    ),
    (
        "binary length not a number",
        "/v2/models/colbert/infer",
        b'{"inputs": [' + _QUERY + b"]}",
        "Inference-Header-Content-Length must be the byte length of the body's JSON part",
        {**_FORM, "Inference-Header-Content-Length": "abc"},
    ),
    (
        "binary tensor cut short",
        "/v2/models/colbert/infer",
        _BINARY + b"\xff\xff\xff\x7fq",
        "the v2 binary request cannot be read",
        {**_FORM, "Inference-Header-Content-Length": str(len(_BINARY))},
    ),
    ("10 MB body", "/v1/models/colbert:predict", b"x" * (10 << 20), f"at most {MAX_BODY}", {}),
]


def _error_lines(output: str) -> list[str]:
    """What a client's mistake must not put in the server's log: ERROR lines, tracebacks, Python warnings."""
    return [line for line in output.splitlines() if " ERROR " in line or "Traceback" in line or "Warning:" in line]


@pytest.mark.slow
@needs_kserve
@pytest.mark.parametrize("name,path,body,message,headers", BAD_HTTP, ids=[b[0] for b in BAD_HTTP])
def test_a_bad_request_is_a_400_and_one_line_and_the_server_goes_on(exact_server, name, path, body, message, headers):
    status, answer = exact_server.post(path, body, headers)
    assert status == 400, answer
    assert message in answer["error"] and "\n" not in answer["error"] and "Traceback" not in answer["error"]
    status, after = exact_server.v1([{"query": "a query after a bad one", "k": 3}])
    assert status == 200 and len(after["predictions"][0]["ids"]) == 3
    assert f"INFO bad request: {answer['error']}" in exact_server.output()
    assert _error_lines(exact_server.output()) == []  # a client's mistake is no server error: INFO, one line


@pytest.mark.slow
@needs_kserve
def test_the_v2_binary_extension_is_still_read(exact_server):
    """A good binary-extension request answers: the check before KServe reads the body as KServe reads it."""
    status, answer = exact_server.post(
        "/v2/models/colbert/infer",
        _BINARY + b"\x01\x00\x00\x00q",
        {**_FORM, "Inference-Header-Content-Length": str(len(_BINARY))},
    )
    assert status == 200 and len(answer["outputs"][0]["data"]) == 10, answer


@pytest.mark.slow
@needs_kserve
def test_only_the_documented_routes_are_served(exact_server):
    """KServe's model repository (unload, load), :explain, versions and the OpenAPI schema are refused; the
    model keeps serving, and the v2 metadata lists the tensors."""
    for path in (
        "/v2/repository/models/colbert/unload",
        "/v2/repository/models/colbert/load",
        "/v2/repository/index",
        "/v1/models/colbert:explain",
        "/v2/models/colbert/versions/1/infer",
    ):
        status, answer = exact_server.post(path, b"{}")
        assert status == 404 and "is not a route of this server" in answer["error"], (path, answer)
    for path in ("/openapi.json", "/docs", "/v2", "/v2/models", "/v1/models", "/v2/models/colbert/versions/1"):
        assert exact_server.get(path)[0] == 404, path
    assert exact_server.get("/") == (200, {"status": "alive"})
    assert exact_server.get("/v2/health/live")[0] == 200 and exact_server.get("/v1/models/colbert")[0] == 200
    status, answer = exact_server.v1([{"query": "still served", "k": 2}])
    assert status == 200 and answer["predictions"][0]["found"] == 2
    status, answer = exact_server.post("/v1/models/other:predict", {"instances": [{"query": "q"}]})
    assert status == 404 and "other" in answer["error"]  # another model's name: the client's mistake, at INFO
    assert _error_lines(exact_server.output()) == []
    status, meta = exact_server.get("/v2/models/colbert")
    assert status == 200
    assert [(t["name"], t["datatype"]) for t in meta["inputs"]] == [
        ("query", "BYTES"),
        ("k", "INT32"),
        ("documents", "BYTES"),
    ]
    assert [(t["name"], t["datatype"]) for t in meta["outputs"]] == [
        ("ids", "BYTES"),
        ("scores", "FP32"),
        ("found", "INT32"),
    ]


@pytest.mark.slow
@needs_kserve
def test_serve_local_listens_on_the_loopback_address_only(exact_server):
    import psutil

    connections = psutil.Process(exact_server.proc.pid).net_connections("tcp")
    assert {tuple(c.laddr) for c in connections if c.status == "LISTEN"} == {("127.0.0.1", exact_server.port)}
    assert f"serving colbert on http://127.0.0.1:{exact_server.port}:" in exact_server.output()


@pytest.mark.parametrize(
    "flags,want",
    [([], "127.0.0.1"), (["--host", "0.0.0.0"], "0.0.0.0"), (["--host", "::1"], "::1")],
    ids=["default", "every interface", "ipv6"],
)
def test_serve_local_passes_the_address_it_was_given(monkeypatch, flags, want):
    from click.testing import CliRunner

    from operator_cli.cli import cli

    ran = []
    monkeypatch.setenv("COLBERT_K8S_SERVE_PYTHON", sys.executable)
    monkeypatch.setattr("os.execve", lambda path, argv, env: ran.append(argv))
    res = CliRunner().invoke(cli, ["serve", "--local", "s3://models/run-1/", *flags])
    assert res.exit_code == 0, res.output
    (argv,) = ran
    assert argv[argv.index("--host") + 1] == want


def test_serve_local_refuses_a_bad_host_in_one_line(monkeypatch):
    from click.testing import CliRunner

    from operator_cli.cli import cli

    monkeypatch.setattr("os.execve", lambda *a: pytest.fail("it ran"))
    res = CliRunner().invoke(cli, ["serve", "--local", "s3://models/run-1/", "--host", "no such host!"])
    assert res.exit_code == 2 and "--host must be an IP address or a host name" in res.output
    assert "Traceback" not in res.output


PREDICTOR_ENV = [
    ("unset", {}, [], None, False, False),
    ("onnx int8", {"COLBERT_SERVE_ONNX": "int8", "COLBERT_SERVE_ALLOW_INT8_LOSS": "1"}, [], "int8", True, False),
    ("switch off", {"COLBERT_SERVE_ONNX": "fp32", "COLBERT_SERVE_ALLOW_INT8_LOSS": "0"}, [], "fp32", False, False),
    ("empty", {"COLBERT_SERVE_ONNX": "", "COLBERT_SERVE_ALLOW_INT8_LOSS": ""}, [], None, False, False),
    ("flags win", {"COLBERT_SERVE_ONNX": "int8"}, ["--onnx", "--allow-int8-loss"], "fp32", True, False),
    ("exact on", {"COLBERT_SERVE_EXACT": "1"}, [], None, False, True),
    ("exact off", {"COLBERT_SERVE_EXACT": "0"}, [], None, False, False),
    ("exact flag", {"COLBERT_SERVE_EXACT": "0"}, ["--exact"], None, False, True),
]


@pytest.mark.parametrize("name,env,argv,onnx,allow,exact", PREDICTOR_ENV, ids=[c[0] for c in PREDICTOR_ENV])
def test_the_predictor_reads_its_options_from_its_environment(monkeypatch, name, env, argv, onnx, allow, exact):
    """What `serve render|apply` writes into the container (COLBERT_SERVE_EXACT, COLBERT_SERVE_ONNX,
    COLBERT_SERVE_ALLOW_INT8_LOSS)."""
    from trainer.serve.options import parse

    for key in ("COLBERT_SERVE_EXACT", "COLBERT_SERVE_ONNX", "COLBERT_SERVE_ALLOW_INT8_LOSS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    args = parse(["/mnt/models", *argv])
    assert (args.onnx, args.allow_int8_loss, args.exact) == (onnx, allow, exact)
    assert type(args.allow_int8_loss) is bool and type(args.exact) is bool  # never "1" or "" past parse


def test_the_predictors_cache_and_batching_come_typed_from_its_flags_or_environment(monkeypatch):
    from trainer.serve.batcher import BatchOptions
    from trainer.serve.options import parse

    monkeypatch.setenv("COLBERT_SERVE_CACHE", "/cache/serve")
    monkeypatch.setenv("COLBERT_SERVE_QUEUE", "8")
    args = parse(["/mnt/models", "--batch-size", "32"])
    assert args.cache_dir == "/cache/serve" and args.batching == BatchOptions(max_size=32, max_queue=8)
    assert parse(["/mnt/models", "--cache-dir", "here"]).cache_dir == "here"
    monkeypatch.delenv("COLBERT_SERVE_CACHE")
    assert parse(["/mnt/models"]).cache_dir == ".cache/colbert-k8s"


BAD_PREDICTOR_ENV = [
    ("onnx form", {"COLBERT_SERVE_ONNX": "fp16"}, "COLBERT_SERVE_ONNX must be fp32 or int8 (or unset), got 'fp16'"),
    (
        "int8 loss true",
        {"COLBERT_SERVE_ALLOW_INT8_LOSS": "true"},
        "COLBERT_SERVE_ALLOW_INT8_LOSS must be 1 or 0 (or unset), got 'true'",
    ),
    ("exact yes", {"COLBERT_SERVE_EXACT": "yes"}, "COLBERT_SERVE_EXACT must be 1 or 0 (or unset), got 'yes'"),
    (
        "precision fp16",
        {"COLBERT_SERVE_PRECISION": "fp16"},
        "COLBERT_SERVE_PRECISION must be fp32 or bf16 (or unset), got 'fp16'",
    ),
]


@pytest.mark.parametrize("name,env,message", BAD_PREDICTOR_ENV, ids=[c[0] for c in BAD_PREDICTOR_ENV])
def test_a_bad_predictor_environment_variable_is_one_line(name, env, message):
    """``python -m trainer.serve`` itself: argparse takes an environment default without checking its choices."""
    import os

    clean = {k: v for k, v in os.environ.items() if not k.startswith("COLBERT_SERVE_")}
    res = subprocess.run(
        [sys.executable, "-m", "trainer.serve", "/mnt/models"],
        cwd=ROOT,
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [f"serve: error: {message}"], res.stderr


def _v2_search(queries: list[str], k: int) -> list[dict]:
    return [
        {"name": "query", "shape": [len(queries)], "datatype": "BYTES", "data": queries},
        {"name": "k", "shape": [1], "datatype": "INT32", "data": [k]},
    ]


def _rows(answer: tuple[int, dict]) -> list[tuple[list, list, int]]:
    """Each query's (ids, scores to 4 decimals, found) of a v2 search answer, its shapes checked."""
    status, body = answer
    assert status == 200, body
    out = {o["name"]: o for o in body["outputs"]}
    rows, k = out["ids"]["shape"]
    assert out["scores"]["shape"] == [rows, k] and out["found"]["shape"] == [rows]
    return [
        (
            out["ids"]["data"][i * k : (i + 1) * k],
            [round(s, 4) for s in out["scores"]["data"][i * k : (i + 1) * k]],
            out["found"]["data"][i],
        )
        for i in range(rows)
    ]


@pytest.mark.slow
@needs_kserve
def test_a_v2_querys_answer_in_a_batch_is_its_answer_alone(served, exact_server):
    queries = served[2].queries[:4]
    together = _rows(exact_server.v2(_v2_search(queries, 30)))
    assert together == [_rows(exact_server.v2(_v2_search([q], 30)))[0] for q in queries]


@pytest.mark.slow
@needs_kserve
def test_served_plaid_search_is_the_indexs_own_answer(served):
    """Index mode answers as the index phase measured it (PyLate's encode, the PLAID index, its scores); a
    query's v2 answer in a batch is its answer alone."""
    from pylate import indexes

    out, model, split = served
    index = indexes.PLAID(index_folder=str(out / "index"), index_name="colbert", override=False, show_progress=False)
    want = index(model.encode(split.queries[:5], is_query=True), k=10)
    server = Predictor(str(out))
    try:
        status, body = server.v1([{"query": q, "k": 10} for q in split.queries[:5]])
        batch = _rows(server.v2(_v2_search(split.queries[:4], 40)))
        alone = [_rows(server.v2(_v2_search([q], 40)))[0] for q in split.queries[:4]]
    finally:
        server.close()
    assert status == 200, body
    assert [p["ids"] for p in body["predictions"]] == [[h["id"] for h in hits] for hits in want]
    assert "search of 47 documents by the PLAID index" in server.output()
    assert batch == alone


@pytest.mark.slow
@needs_kserve
def test_short_answers_are_reported_and_logged_once():
    """An engine that finds fewer than k (PLAID does) says so: ``found`` in v1 and v2, rows padded to k and never
    cut to another query's length, and one log line for the server's life."""
    server = Predictor(standin=True)
    try:
        status, body = server.v1([{"query": "finds 3", "k": 5}, {"query": "finds 5", "k": 5}])
        assert status == 200 and [p["found"] for p in body["predictions"]] == [3, 5]
        assert body["predictions"][0]["ids"] == ["d0", "d1", "d2"]
        texts = ["finds 2", "finds 4", "finds 9"]
        batch = _rows(server.v2(_v2_search(texts, 4)))
        assert batch[0] == (["d0", "d1", "", ""], [100.0, 99.0, 0.0, 0.0], 2)
        assert batch == [_rows(server.v2(_v2_search([q], 4)))[0] for q in texts]
    finally:
        server.close()
    said = [line for line in server.output().splitlines() if "PLAID found fewer than k" in line]
    assert len(said) == 1 and "(3 of 5 asked)" in said[0], said


@pytest.mark.slow
@needs_kserve
def test_liveness_fails_once_the_model_is_not_loaded():
    """KServe's own liveness says alive with no model; this one answers 503, so the kubelet restarts the pod."""
    server = Predictor(standin=True)
    try:
        assert server.get("/") == (200, {"status": "alive"}) and server.get("/v2/health/live")[0] == 200
        server.stop_model()
        for path in ("/", "/v2/health/live"):
            status, answer = server.get(path)
            assert status == 503 and answer == {"error": "the model colbert is not loaded"}, (path, answer)
        assert server.get("/v1/models/colbert")[0] != 200  # readiness, as KServe answers it
    finally:
        server.close()
    assert "liveness: the model colbert is not loaded" in server.output()


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
