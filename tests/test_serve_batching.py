"""Serving under load (trainer/serve/): the PLAID index held in memory (no file read per search), concurrent
requests batched into one encode and one search (trainer/serve/batcher.py) with the answers of each request
alone, a bounded queue, and rerank scored by PyLate's MaxSim over the candidates of many requests at once."""

from __future__ import annotations

import shutil

import pytest

from tests.helpers.serving import served_output


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
