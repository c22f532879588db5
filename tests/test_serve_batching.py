"""Serving under load (trainer/serve/): the PLAID index held in memory (no file read per search), concurrent
requests batched into one encode and one search (trainer/serve/batcher.py) with the answers of each request
alone, a bounded queue, and rerank scored by PyLate's MaxSim over the candidates of many requests at once."""

from __future__ import annotations

import shutil

import pytest

from tests.helpers.serving import SERVE_PYTHON, SKIP_REASON, Predictor, served_output
from trainer.serve.batcher import Batcher, BatchOptions, Overloaded, add_batch_arguments, batch_options


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model):
    """A job's output_dir (final model, PLAID index with the corpus embeddings), its model and its BEIR split."""
    from pylate import models

    from trainer.evaluate import load_beir

    root = tmp_path_factory.mktemp("served")
    out = served_output(root, tiny_model)
    return out, models.ColBERT(str(out / "final-model")), load_beir(root / "beir")


@pytest.fixture(scope="module")
def plaid_engine(served):
    from trainer.serve.engine import Engine, locate

    out = served[0]
    return Engine(*locate(str(out), out / "cache"), exact=False, device="cpu")


def _pylate_search(out, model, queries: list[str], k: int) -> list[list[dict]]:
    from pylate import indexes

    index = indexes.PLAID(index_folder=str(out / "index"), index_name="colbert", override=False, show_progress=False)
    return index(model.encode(queries, is_query=True), k=k)


# ---- the index in memory -----------------------------------------------------------------------------------


def test_plaid_search_is_pylates_search_id_for_id_and_score(served, plaid_engine):
    out, model, split = served
    want = _pylate_search(out, model, split.queries, 10)
    got = plaid_engine.search(split.queries, 10)
    assert [ids for ids, _ in got] == [[h["id"] for h in hits] for hits in want]
    assert [scores for _, scores in got] == [[h["score"] for h in hits] for hits in want]
    assert plaid_engine.documents == 47


def test_a_served_index_reads_no_file_per_search(served, tmp_path):
    """Once loaded, the engine answers with the ids files gone: nothing is read per request."""
    from trainer.serve.engine import Engine, locate

    out, model, split = served
    copy = tmp_path / "output"
    shutil.copytree(out, copy)
    engine = Engine(*locate(str(copy), tmp_path / "cache"), exact=False, device="cpu")
    for gone in ("corpus-ids.json", "colbert/plaid_ids_to_documents_ids.pkl", "colbert/documents_ids_to_plaid_ids.pkl"):
        (copy / "index" / gone).unlink()
    got = engine.search(split.queries[:5], 10)
    assert [ids for ids, _ in got] == [
        [h["id"] for h in hits] for hits in _pylate_search(out, model, split.queries[:5], 10)
    ]


def test_an_index_without_its_ids_file_takes_pylates_mapping_once(served, tmp_path):
    """An index built before the index phase wrote corpus-ids.json: the ids come from PyLate's saved mapping."""
    from trainer.run.checkpoint import write_manifest
    from trainer.serve.engine import Engine, locate

    out, model, split = served
    copy = tmp_path / "output"
    shutil.copytree(out, copy)
    (copy / "index" / "corpus-ids.json").unlink()
    (copy / "index" / "corpus.safetensors").unlink()
    write_manifest(copy / "index")
    engine = Engine(*locate(str(copy), tmp_path / "cache"), exact=False, device="cpu")
    got = engine.search(split.queries[:5], 10)
    assert [ids for ids, _ in got] == [
        [h["id"] for h in hits] for hits in _pylate_search(out, model, split.queries[:5], 10)
    ]


def test_ids_that_do_not_match_the_index_are_one_line(served, tmp_path):
    import json

    from trainer.run.checkpoint import write_manifest
    from trainer.serve import ServeError
    from trainer.serve.engine import Engine, locate

    copy = tmp_path / "output"
    shutil.copytree(served[0], copy)
    ids = copy / "index" / "corpus-ids.json"
    ids.write_text(json.dumps(json.loads(ids.read_text())[:-1]))
    write_manifest(copy / "index")
    with pytest.raises(ServeError, match=r"the PLAID index holds 47 documents, its ids 46; build the index again"):
        Engine(*locate(str(copy), tmp_path / "cache"), exact=False, device="cpu")


# ---- a batch answers each request as it would be answered alone ---------------------------------------------


@pytest.fixture(scope="module")
def exact_engine(served):
    from trainer.serve.engine import Engine, locate

    out = served[0]
    return Engine(*locate(str(out), out / "cache"), exact=True, device="cpu")


def _requests(split) -> list:
    from trainer.serve.requests import Rerank, Search

    q, docs = split.queries, split.corpus
    return [
        Search([q[0]], 10),
        Rerank(q[1], docs[:5]),
        Search([q[2], q[3], q[4]], 3),
        Search([q[5]], 10),
        Rerank(q[6], docs[5:17]),
        Search([q[7]], 1000),
    ]


@pytest.mark.parametrize("which", ["plaid_engine", "exact_engine"], ids=["PLAID", "exact"])
def test_a_batch_gives_each_request_its_answer_alone_to_the_id_and_score(served, which, request):
    engine = request.getfixturevalue(which)
    requests = _requests(served[2])
    alone = [engine.answer([r])[0] for r in requests]
    assert engine.answer(requests) == alone
    assert len(alone[5][0][0]) == 47  # k past the corpus: every document, once


@pytest.mark.parametrize("which", ["plaid_engine", "exact_engine"], ids=["PLAID", "exact"])
def test_concurrent_requests_through_the_batcher_are_one_batch_with_the_answers_alone(served, which, request):
    from trainer.serve.engine import texts_of

    engine = request.getfixturevalue(which)
    requests = _requests(served[2])
    batcher = Batcher(engine.stages, max_wait=0, size=texts_of)
    assert _run(_gather(batcher, requests)) == [engine.answer([r])[0] for r in requests]
    assert list(batcher.batches) == [len(requests)]


@pytest.mark.parametrize("which", ["plaid_engine", "exact_engine"], ids=["PLAID", "exact"])
def test_the_encode_stage_never_searches_and_the_search_stage_never_encodes(served, which, request):
    """The engine's two stages split its work where the batcher overlaps it: the first encodes (and answers the
    reranks), the second only searches; one after the other they are :meth:`Engine.answer`."""
    engine = request.getfixturevalue(which)
    requests = _requests(served[2])
    alone = [engine.answer([r])[0] for r in requests]

    def refused(*_a, **_k):
        raise AssertionError("called in the wrong stage")

    search = engine.index if engine.index is not None else engine.corpus
    name = "search" if engine.index is not None else "search_embedded"
    setattr(search, name, refused)
    try:
        encoded = engine.encode_batch(requests)
    finally:
        delattr(search, name)
    engine.model.encode = engine.model.tokenize = refused  # both encoders: PyLate's, and the evaluation's
    try:
        answers = engine.search_batch(encoded)
    finally:
        del engine.model.encode, engine.model.tokenize
    assert answers == alone
    assert [type(e).__name__ for e in encoded] == ["_Encoded", "list", "_Encoded", "_Encoded", "list", "_Encoded"]


def test_a_search_refused_does_not_fail_the_reranks_beside_it(served):
    from trainer.serve.engine import Engine
    from trainer.serve.requests import BadRequest

    out, _, split = served
    engine = Engine(out / "final-model", None, exact=False, device="cpu")  # exported without an index
    requests = _requests(split)
    answers = engine.answer(requests)
    assert [type(a).__name__ for a in answers] == [
        "BadRequest",
        "list",
        "BadRequest",
        "BadRequest",
        "list",
        "BadRequest",
    ]
    assert "exported without an index" in str(answers[0]) and isinstance(answers[0], BadRequest)
    assert answers[1] == engine.answer([requests[1]])[0]


# ---- rerank --------------------------------------------------------------------------------------------------


def _plain_maxsim(model, query: str, document: str) -> float:
    """The reference: each of the query's token embeddings, its best match among the document's own, summed."""
    import torch

    q = torch.as_tensor(model.encode([query], is_query=True)[0])  # (q_tokens, dim)
    d = torch.as_tensor(model.encode([document], is_query=False)[0])  # (its tokens, dim)
    return sum(max(float(qt @ dt) for dt in d) for qt in q)


def test_reranks_batched_together_are_each_documents_plain_maxsim(served, plaid_engine):
    """Three concurrent reranks (5, 12 and 1 candidates, of different lengths) in one batch: every score is the
    plain MaxSim loop over that candidate alone."""
    from trainer.serve.requests import Rerank

    _, model, split = served
    requests = [
        Rerank(split.queries[0], split.corpus[:5]),
        Rerank(split.queries[1], split.corpus[5:17]),
        Rerank(split.queries[2], [split.corpus[40]]),
    ]
    got = plaid_engine.answer(requests)
    for request, scores in zip(requests, got):
        want = [_plain_maxsim(model, request.query, d) for d in request.documents]
        assert scores == pytest.approx(want, abs=1e-4)


# ---- the batcher, alone ------------------------------------------------------------------------------------


def _run(coroutine):
    import asyncio

    return asyncio.run(coroutine)


async def _gather(batcher, items):
    import asyncio

    return await asyncio.gather(*(batcher.submit(i) for i in items), return_exceptions=True)


async def _within(seconds: float, awaitable):
    """``awaitable``, or a failure that says the batcher stopped answering (a bound, so a stuck stage fails the
    test instead of hanging it)."""
    import asyncio

    try:
        return await asyncio.wait_for(awaitable, seconds)
    except TimeoutError:
        raise AssertionError(f"no answer within {seconds} s: a batch is stuck in a stage") from None


def test_concurrent_requests_are_one_call_and_each_gets_its_own_answer():
    calls = []

    def run(items):
        calls.append(list(items))
        return [i * 10 for i in items]

    batcher = Batcher(run, max_wait=0)
    assert _run(_gather(batcher, [1, 2, 3, 4])) == [10, 20, 30, 40]
    assert calls == [[1, 2, 3, 4]]


def test_a_failure_is_its_own_requests_and_a_failed_batch_everyones():
    def run(items):
        if "all" in items:
            raise RuntimeError("the device is gone")
        return [ValueError(f"bad {i}") if i == "bad" else i.upper() for i in items]

    got = _run(_gather(Batcher(run, max_wait=0), ["a", "bad", "c"]))
    assert got[0] == "A" and got[2] == "C" and isinstance(got[1], ValueError) and str(got[1]) == "bad bad"
    got = _run(_gather(Batcher(run, max_wait=0), ["a", "all"]))
    assert [str(g) for g in got] == ["the device is gone"] * 2


@pytest.mark.parametrize(
    "sizes,max_size,batches",
    [([1] * 5, 2, [2, 2, 1]), ([2, 2, 2], 4, [2, 1]), ([9, 1, 1], 4, [1, 2]), ([1, 9], 4, [1, 1])],
    ids=["by count", "by weight", "a large one alone", "a large one after a small"],
)
def test_a_batch_holds_at_most_max_size_texts(sizes, max_size, batches):
    batcher = Batcher(lambda items: items, max_wait=0, max_size=max_size, size=lambda i: sizes[i])
    assert _run(_gather(batcher, list(range(len(sizes))))) == list(range(len(sizes)))
    assert list(batcher.batches) == batches


async def _while_a_batch_runs(max_queue: int, then):
    """A batcher whose first batch blocks in its worker thread until released; ``then(batcher)`` runs meanwhile
    on the event loop and gives (a value, the requests it left waiting). Returns (that value, whether the batch
    was still running then, the first request's answer, the waiting requests' answers)."""
    import asyncio
    import threading

    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def run(items):
        started.set()
        release.wait(60)  # a bound, so that a loop blocked by the batch fails the test instead of hanging it
        finished.set()
        return items

    batcher = Batcher(run, max_wait=0, max_queue=max_queue)
    first = asyncio.ensure_future(batcher.submit("first"))
    await asyncio.to_thread(started.wait, 60)
    try:
        seen, waiting = await then(batcher)
        running = not finished.is_set()
    finally:
        release.set()
    return seen, running, await first, await asyncio.gather(*waiting)


def test_past_the_queue_bound_a_request_is_refused_at_once_in_one_line():
    import asyncio

    async def fill(batcher):
        waiting = [asyncio.ensure_future(batcher.submit(f"waits {i}")) for i in range(2)]
        await asyncio.sleep(0)  # they are queued
        try:
            await batcher.submit("one too many")
        except Overloaded as e:
            return str(e), waiting
        return None, waiting

    refused, running, first, waited = _run(_while_a_batch_runs(2, fill))
    assert running and first == "first" and waited == ["waits 0", "waits 1"]
    assert refused == (
        "the predictor has 2 requests waiting; retry in a moment, or add replicas (serve apply --max-replicas)"
    )


def test_the_event_loop_answers_while_a_batch_runs():
    """Readiness and health are coroutines on the server's loop: one answers while a long batch runs."""

    async def probe(_batcher):
        return "ready", []

    seen, running, first, _ = _run(_while_a_batch_runs(4, probe))
    assert seen == "ready" and running and first == "first"


# ---- the batcher's stages: one batch encoded while the one before is searched ---------------------------------


def test_the_next_batch_is_in_the_first_stage_while_the_one_before_is_in_the_second():
    """The first batch's second stage waits for the second batch's first stage: a batcher that ran one batch at a
    time through both would never let it."""
    import threading

    overlapped = threading.Event()

    def encode(items):
        if items == ["second"]:
            overlapped.set()
        return items

    def search(items):
        if items == ["first"] and not overlapped.wait(60):  # a bound: a serial batcher fails instead of hanging
            raise AssertionError("the second batch was not encoded while the first was searched")
        return [i.upper() for i in items]

    batcher = Batcher([encode, search], max_wait=0, max_size=1)
    assert _run(_within(120, _gather(batcher, ["first", "second"]))) == ["FIRST", "SECOND"]


def test_at_most_one_batch_waits_between_the_stages_and_the_order_is_kept():
    """While the first batch is held in the second stage, the second has been through the first stage and waits;
    the next batches are not even taken (the queue holds them). A request the first stage refuses is answered at
    once and never reaches the second. Released, every batch goes through in the order it came."""
    import asyncio
    import threading

    go, encoded, searched = threading.Event(), [], []

    def encode(items):
        encoded.append(list(items))
        return [ValueError(f"refused {i}") if i == "refused" else i for i in items]

    def search(items):
        searched.append(list(items))
        if items == ["first"]:
            go.wait(60)
        return [i.upper() for i in items]

    async def scenario():
        sizes = {"refused": 1, "second": 1}
        batcher = Batcher([encode, search], max_wait=0, max_size=2, size=lambda i: sizes.get(i, 2))
        names = ["first", "refused", "second", "third", "fourth"]
        answers = [asyncio.ensure_future(batcher.submit(n)) for n in names]
        try:
            # answered by the first stage: the second batch has left it, and the batcher has seen that
            await asyncio.wait_for(asyncio.gather(answers[1], return_exceptions=True), 60)
        except TimeoutError:
            go.set()
            raise AssertionError("the second batch was not encoded while the first was held in the search") from None
        for _ in range(20):  # let the event loop do what it would: take another batch, if it were allowed to
            await asyncio.sleep(0)
        held = list(batcher.batches), len(batcher._queue), [list(e) for e in encoded], [list(s) for s in searched]
        go.set()
        return held, await _within(60, asyncio.gather(*answers, return_exceptions=True))

    (taken, queued, encoded_then, searched_then), got = _run(scenario())
    assert taken == [1, 2] and queued == 2, "a third batch was taken while one already waited between the stages"
    assert encoded_then == [["first"], ["refused", "second"]] and searched_then == [["first"]]
    assert got[0] == "FIRST" and str(got[1]) == "refused refused" and got[2:] == ["SECOND", "THIRD", "FOURTH"]
    assert encoded == [["first"], ["refused", "second"], ["third"], ["fourth"]]
    assert searched == [["first"], ["second"], ["third"], ["fourth"]]


@pytest.mark.parametrize("failing", ["encode", "search"])
def test_a_stage_that_fails_answers_its_own_batch_and_the_next_goes_on(failing):
    """A stage's exception is the answer of every request of its batch, and of no other; a request's own exception
    (here from the search) stays that request's."""

    def encode(items):
        if failing == "encode" and "boom" in items:
            raise RuntimeError("the device is gone")
        return items

    def search(items):
        if failing == "search" and "boom" in items:
            raise RuntimeError("the device is gone")
        return [ValueError("bad one") if i == "bad" else i.upper() for i in items]

    got = _run(_within(60, _gather(Batcher([encode, search], max_wait=0, max_size=2), ["a", "boom", "c", "bad"])))
    assert [str(g) for g in got[:2]] == ["the device is gone"] * 2 and all(isinstance(g, RuntimeError) for g in got[:2])
    assert got[2] == "C" and isinstance(got[3], ValueError) and str(got[3]) == "bad one"


def test_run_must_be_a_callable_or_callables():
    with pytest.raises(ValueError, match="`run` must be a callable or a sequence of them, got"):
        Batcher([])


@pytest.mark.parametrize(
    "options,message",
    [
        ({"max_wait_ms": -1}, "`max_wait_ms` must be from 0 to 1000 milliseconds, got -1"),
        ({"max_size": 0}, "`max_size` must be 1 or more texts, got 0"),
        ({"max_queue": 0}, "`max_queue` must be 1 or more requests, got 0"),
    ],
    ids=["negative wait", "no size", "no queue"],
)
def test_batch_options_refuse_a_bad_value_in_one_line(options, message):
    with pytest.raises(ValueError) as e:
        BatchOptions(**options)
    assert str(e.value) == message


@pytest.mark.parametrize(
    "argv,env,message",
    [
        (["--queue", "many"], {}, "--queue (or COLBERT_SERVE_QUEUE) must be an integer, got 'many'"),
        ([], {"COLBERT_SERVE_BATCH_WAIT_MS": "5000"}, "--batch-wait-ms (or COLBERT_SERVE_BATCH_WAIT_MS) must be from"),
    ],
    ids=["flag", "environment"],
)
def test_the_predictors_batching_flags_are_checked_in_one_line(argv, env, message, monkeypatch):
    import argparse

    from trainer.serve import ServeError

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    p = argparse.ArgumentParser()
    add_batch_arguments(p)
    with pytest.raises(ServeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        batch_options(p.parse_args(argv))


# ---- over HTTP ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not SERVE_PYTHON.exists(), reason=SKIP_REASON)
def test_a_full_queue_is_a_503_in_one_line_and_the_server_goes_on(served):
    """12 concurrent reranks of 1000 texts against a queue of 1: what the queue cannot hold is refused at once with
    503, Retry-After and one line; the rest are answered; afterwards the server answers as before."""
    import json
    import urllib.error
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    out, _, split = served
    server = Predictor(str(out), env={"COLBERT_SERVE_QUEUE": "1", "COLBERT_SERVE_BATCH_SIZE": "1"})
    body = json.dumps({"instances": [{"query": split.queries[0], "documents": (split.corpus * 22)[:1000]}]})

    def rerank(_):
        request = urllib.request.Request(
            f"{server.url}/v1/models/colbert:predict", body.encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=600) as r:
                return r.status, json.loads(r.read()), None
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read()), e.headers.get("Retry-After")

    try:
        with ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(rerank, range(12)))
        after = server.v1([{"query": split.queries[1], "k": 3}])
    finally:
        server.close()
    statuses = sorted(status for status, _, _ in answers)
    assert set(statuses) == {200, 503}, statuses  # some answered, the others refused; none failed, none hung
    for status, answer, retry in answers:
        if status == 200:
            assert len(answer["predictions"][0]["scores"]) == 1000
        else:
            assert (
                answer
                == {
                    "error": "the predictor has 1 requests waiting; retry in a moment, or add replicas "
                    "(serve apply --max-replicas)"
                }
                and retry == "1"
            )
    assert after[0] == 200 and len(after[1]["predictions"][0]["ids"]) == 3
    assert "Traceback" not in server.output() and "refused: the predictor has 1 requests waiting" in server.output()


# ---- the bfloat16 encoder ----------------------------------------------------------------------------------


def test_a_bf16_engine_encodes_under_bfloat16_autocast_and_answers_near_float32(served, plaid_engine):
    """``precision="bf16"``: the model's layers run under torch's bfloat16 autocast (only the encode: the
    search is the same), embeddings come back float32, and answers stay close to the float32 engine's."""
    import torch

    from trainer.serve import ServeError
    from trainer.serve.engine import Engine, locate
    from trainer.serve.requests import Rerank, Search

    out, _, split = served
    engine = Engine(*locate(str(out), out / "cache"), exact=True, device="cpu", precision="bf16")
    assert engine.describe().endswith("encoder: bfloat16 autocast")
    seen, transformer = [], engine.model[0]
    forward = transformer.forward

    def spy(*args, **kwargs):
        seen.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)
        return forward(*args, **kwargs)

    transformer.forward = spy
    fp32 = Engine(*locate(str(out), out / "cache"), exact=True, device="cpu")
    batch = [Search(split.queries[:4], 5), Rerank(split.queries[4], split.corpus[:6])]
    got, want = engine.answer(batch), fp32.answer(batch)
    assert seen and all(seen)
    assert not torch.is_autocast_enabled("cpu")  # only inside the encode
    assert [ids[0] for ids, _ in got[0]] == [ids[0] for ids, _ in want[0]]
    assert got[1] == pytest.approx(want[1], abs=0.05 * len(got[1]))
    assert engine.model.encode(split.queries[:1], is_query=True)[0].dtype.name == "float32"
    with pytest.raises(ServeError, match="ONNX encoder"):
        Engine(*locate(str(out), out / "cache"), exact=False, device="cpu", onnx="fp32", precision="bf16")
