"""The index phase encodes the corpus in bounded chunks: the build holds one chunk's embeddings beside the index,
never the whole corpus's, and the index it makes holds every document once, searchable and served by id."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

CHUNK = 8


@pytest.fixture
def small_job(tmp_path, tiny_model):
    """A BEIR split of 30 real docstrings (not a multiple of the chunk) and a config indexing it."""
    from trainer.config.load import parse_config
    from trainer.quickstart_data import TEST_MODULES, _triplets, write_beir

    rows = _triplets(TEST_MODULES[:4], random.Random(0))[:30]
    write_beir(tmp_path / "beir", [(r["id"], r["positive"]) for r in rows], [(r["id"], r["query"]) for r in rows[:10]])
    cfg = parse_config(
        {
            "model": {"name_or_path": str(tiny_model), "query_length": 16, "document_length": 48},
            "data": {"train": {"path": "t.jsonl"}, "eval_beir": str(tmp_path / "beir")},
            "training": {"max_steps": 1},
            "index": {},
            "output_dir": str(tmp_path / "out"),
        }
    )
    return cfg, [r["id"] for r in rows]


def test_the_index_build_encodes_and_adds_the_corpus_a_chunk_at_a_time(small_job, tiny_model, monkeypatch):
    from pylate import indexes, models

    import trainer.retrieval.plaid
    from trainer.index import build_and_evaluate
    from trainer.serve.plaid import PlaidIndex

    cfg, corpus_ids = small_job
    monkeypatch.setattr(trainer.retrieval.plaid, "ENCODE_CHUNK", CHUNK)
    encoded, added = [], []
    encode, add = models.ColBERT.encode, indexes.PLAID.add_documents

    def counting_encode(self, sentences, *args, is_query=True, **kwargs):
        if not is_query:
            encoded.append(len(sentences))
        return encode(self, sentences, *args, is_query=is_query, **kwargs)

    def counting_add(self, documents_ids, documents_embeddings, **kwargs):
        added.append(len(documents_ids))
        return add(self, documents_ids=documents_ids, documents_embeddings=documents_embeddings, **kwargs)

    monkeypatch.setattr(models.ColBERT, "encode", counting_encode)
    monkeypatch.setattr(indexes.PLAID, "add_documents", counting_add)
    result = build_and_evaluate(str(tiny_model), cfg)

    assert encoded == [8, 8, 8, 6] and added == [8, 8, 8, 6]  # never more than a chunk held at once
    assert result["documents"] == 30 and len(result["chunk_seconds"]) == 4
    out = Path(cfg.output_dir)
    served = json.loads((out / "index" / "corpus-ids.json").read_text())
    assert sorted(served) == sorted(corpus_ids) and served != corpus_ids  # every document once, in a shuffled order
    index = PlaidIndex(out / "index", "cpu")  # one index of the chunks: fast-plaid's count is checked against the ids
    model = models.ColBERT(str(tiny_model), query_length=16, document_length=48)
    hits = index.search(model.encode(["the first query"], is_query=True), k=10)[0]
    assert len(index.ids) == 30 and len(hits) == 10 and {d for d, _ in hits} <= set(corpus_ids)


def test_a_corpus_of_one_chunk_keeps_its_order(small_job, tiny_model):
    from trainer.index import build_and_evaluate

    cfg, corpus_ids = small_job
    build_and_evaluate(str(tiny_model), cfg)
    assert json.loads((Path(cfg.output_dir) / "index" / "corpus-ids.json").read_text()) == corpus_ids


def test_chunks_past_fast_plaids_rebuild_threshold_are_updates_and_stay_searchable(tmp_path, caplog):
    """Beyond 999 documents fast-plaid's update no longer rebuilds from scratch: it compresses the new chunk
    against the first chunk's centroids. Every document is still found by its own tokens, and each chunk is a line
    of the log."""
    import torch

    from trainer.retrieval.plaid import build_index_in_chunks

    generator = torch.Generator().manual_seed(0)
    documents = [torch.nn.functional.normalize(torch.randn(6, 16, generator=generator), dim=-1) for _ in range(2500)]
    calls = []

    def encode(texts: list[str]) -> list:
        calls.append(len(texts))
        return [documents[int(t)] for t in texts]

    ids = [f"d{i}" for i in range(2500)]
    with caplog.at_level("INFO", logger="trainer"):
        index, tokens, seconds = build_index_in_chunks(
            tmp_path, "colbert", 4, ids, [str(i) for i in range(2500)], encode, 0, 1200
        )
    assert calls == [1200, 1200, 100] and tokens == 2500 * 6 and len(seconds) == 3
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("index colbert:")]
    added = [line.split(" documents")[0].removeprefix("index colbert: ") for line in lines]
    assert added == ["1200 of 2500", "2400 of 2500", "2500 of 2500"]
    assert lines[-1].endswith("about 0 min left")
    probe = [0, 1199, 1200, 2399, 2400, 2499]  # each chunk's first and last
    hits = index.search([documents[i] for i in probe], k=1)
    assert [h[0][0] for h in hits] == [ids[i] for i in probe]


def test_plaid_search_scores_as_many_candidates_as_the_top_k_needs(tmp_path, monkeypatch):
    """Every PLAID search (serving, the index phase, mining) asks fast-plaid to score 256 candidates in full for a
    top 10, not PyLate's 8,192 whatever k; a batch's queries go to the server's threads."""
    import torch
    from fast_plaid import search

    from trainer.retrieval.plaid import build_index

    generator = torch.Generator().manual_seed(0)
    documents = [torch.nn.functional.normalize(torch.randn(5, 16, generator=generator), dim=-1) for _ in range(300)]
    index = build_index(tmp_path, "colbert", 4, [f"d{i}" for i in range(300)], documents, seed=0)
    asked, real = [], search.FastPlaid.search

    def spy(self, *args, **kwargs):
        asked.append((kwargs["top_k"], kwargs["n_full_scores"], kwargs["n_processes"]))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(search.FastPlaid, "search", spy)
    index.threads = 2
    for k in (10, 100, 3000):
        hits = index.search(documents[:3], k)
        assert [h[0][0] for h in hits] == ["d0", "d1", "d2"]  # each document is found first by its own tokens
    assert index.search(documents[:1], 10, n_full_scores=8192)[0][0][0] == "d0"
    assert asked == [(10, 256, 2), (100, 8192, 2), (3000, 12000, 2), (10, 8192, 1)]


@pytest.mark.parametrize("flags, warned", [("avx2 avx512f avx512_bf16", True), ("avx512f avx512_fp16", False)])
def test_a_cpu_without_fast_float16_is_named_once_when_a_plaid_index_loads(
    tmp_path, monkeypatch, caplog, flags, warned
):
    """fast-plaid scores in float16 on a CPU too: where torch's float16 is slow, the log says so once a process."""
    import torch

    from trainer.retrieval import plaid

    generator = torch.Generator().manual_seed(0)
    documents = [torch.nn.functional.normalize(torch.randn(5, 16, generator=generator), dim=-1) for _ in range(40)]
    ids = [f"d{i}" for i in range(40)]
    monkeypatch.setattr(plaid, "_warned_half", False)
    monkeypatch.setattr(plaid, "cpu_flags", lambda: flags)
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    with caplog.at_level("WARNING", logger="trainer"):
        index = plaid.build_index(tmp_path, "colbert", 4, ids, documents, seed=0)
        plaid.PlaidSearch(tmp_path / "colbert" / plaid.FAST_PLAID_DIR, ids, device="cpu")
    lines = [r.getMessage() for r in caplog.records if "float16" in r.getMessage()]
    assert len(lines) == (1 if warned else 0), lines
    assert index.search(documents[:1], 10)[0][0][0] == "d0"
