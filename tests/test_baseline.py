"""The base model as it ships (trainer/baseline.py): measured against a plain cosine search, shown beside the
trained model, and a trained model below it kept from the export."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

from trainer import rounds
from trainer.baseline import BelowBase, base_kind, evaluate_base
from trainer.config.load import parse_config
from trainer.env import Layout
from trainer.evaluate import load_beir
from trainer.reporting.progress import Progress

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def _beir(root: Path, docs: int = 40, queries: int = 12) -> Path:
    """A small BEIR split of real docstring text (the quickstart generator's), one relevant document a query."""
    import random

    from trainer.quickstart_data import _triplets

    triplets = _triplets(["json", "csv", "textwrap"], random.Random(0))[:docs]
    (root / "qrels").mkdir(parents=True)
    corpus = [{"_id": f"d{i}", "text": t["positive"]} for i, t in enumerate(triplets)]
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    qs = [{"_id": f"q{i}", "text": t["query"]} for i, t in enumerate(triplets[:queries])]
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in qs))
    (root / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(queries))
    )
    return root


def test_the_base_figures_are_a_plain_cosine_search_of_the_model_as_it_ships(tmp_path):
    """nDCG@10 and MRR@10 computed here by hand, from SentenceTransformer.encode and a sort, per query."""
    from sentence_transformers import SentenceTransformer

    from trainer.model import resolve_model_path

    split = load_beir(_beir(tmp_path / "beir"), "test")
    got = evaluate_base(MINILM, split, batch_size=8, device="cpu")

    model = SentenceTransformer(resolve_model_path(MINILM), device="cpu")
    d = model.encode(split.corpus, normalize_embeddings=True)
    q = model.encode(split.queries, normalize_embeddings=True)
    ndcg = mrr = 0.0
    for qi, qid in enumerate(split.query_ids):
        scores = [(float(q[qi] @ d[j]), split.corpus_ids[j]) for j in range(len(split.corpus))]
        ranked = [doc for _, doc in sorted(scores, key=lambda s: (s[0], s[1]), reverse=True)][:10]
        (relevant,) = split.qrels[qid]
        rank = ranked.index(relevant) if relevant in ranked else None
        ndcg += 1 / math.log2(rank + 2) if rank is not None else 0.0
        mrr += 1 / (rank + 1) if rank is not None else 0.0
    n = len(split.query_ids)
    assert got["ndcg@10"] == pytest.approx(ndcg / n, abs=1e-6)
    assert got["mrr@10"] == pytest.approx(mrr / n, abs=1e-6)
    assert got["recall@100"] == 1.0  # 40 documents: every one is in the top 100


def test_the_kind_of_base_model_is_read_from_its_files(tmp_path, tiny_model):
    assert base_kind(MINILM) == "bi-encoder"  # modules.json with a Pooling module
    assert base_kind(str(tiny_model)) is None  # a bare transformers model: no modules.json
    colbert = tmp_path / "colbert"
    colbert.mkdir()
    (colbert / "modules.json").write_text(
        json.dumps([{"type": "pylate.models.Transformer"}, {"type": "pylate.models.Dense.Dense"}])
    )
    assert base_kind(str(colbert)) == "colbert"
    assert evaluate_base(str(colbert), None, 8, "cpu") is None  # a ColBERT base is measured as itself, before


def _export_cfg(tmp_path, **export):
    return parse_config(
        {
            "data": {"train": {"path": "t.jsonl"}},
            "training": {"max_steps": 1},
            "output_dir": str(tmp_path / "out"),
            "export": {"destination": "s3://bucket/model/", **export},
        }
    )


BELOW = {"base": {"ndcg@10": 0.3167}, "after": {"ndcg@10": 0.3028}}
ABOVE = {"base": {"ndcg@10": 0.3167}, "after": {"ndcg@10": 0.3473}}


@pytest.mark.parametrize(
    "metrics, export_keys, exported",
    [
        (BELOW, {}, False),
        (BELOW, {"allow_regression": True}, True),
        (ABOVE, {}, True),
        ({"after": {"ndcg@10": 0.3}}, {}, True),  # no base measured (no eval split, or a bare transformers model)
    ],
    ids=["below-base-held", "below-base-allowed", "above-base", "no-base-figure"],
)
def test_a_model_below_the_base_model_is_not_exported(tmp_path, monkeypatch, metrics, export_keys, exported):
    sent = []
    monkeypatch.setattr(rounds.export, "run", lambda cfg, progress=None: sent.append(cfg.export.destination))
    cfg = _export_cfg(tmp_path, **export_keys)
    layout = Layout()
    if exported:
        rounds._export(cfg, layout, Progress(enabled=False), metrics)
        assert sent == ["s3://bucket/model/"]
        return
    with pytest.raises(BelowBase) as e:
        rounds._export(cfg, layout, Progress(enabled=False), metrics)
    assert sent == []
    line = str(e.value)
    assert "\n" not in line and "0.3028" in line and "0.3167" in line and "export.allow_regression" in line


def test_the_trainer_ends_a_job_below_the_base_model_with_one_line_and_exit_2(monkeypatch, tmp_path, capsys):
    import trainer.cli as cli

    def below(*args, **kwargs):
        raise BelowBase("the trained model scores ndcg@10 0.3028 ..., below the base model as it ships (0.3167)")

    monkeypatch.setattr(rounds, "run", below)
    # the trainer's CLI points the root logger at this test's captured stderr; later tests must not write there
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    (tmp_path / "t.jsonl").write_text(json.dumps({"query": "q", "positive": "p", "negative": "n"}) + "\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"data: {{train: {{path: {tmp_path}/t.jsonl}}}}\ntraining: {{max_steps: 1}}\n")
    monkeypatch.chdir(tmp_path)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "PET_NNODES"):
        monkeypatch.delenv(key, raising=False)
    assert cli.main(["--config", str(config), "--set", f"output_dir={tmp_path}/out"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("colbert-train: error: the trained model scores ndcg@10 0.3028")


def test_the_card_shows_the_base_model_beside_the_trained_one(tmp_path):
    from trainer.storage.card import render

    cfg = parse_config(
        {
            "model": {"name_or_path": MINILM},
            "data": {"train": {"path": "t.jsonl"}, "eval_beir": str(tmp_path / "beir")},
            "training": {"max_steps": 1},
        }
    )
    metrics = {
        "base": {"ndcg@10": 0.6985, "seconds": 12.0},
        "before": {"ndcg@10": 0.5697},
        "after": {"ndcg@10": 0.7276},
        "hardness": {
            "first": {"step": 5, "easy_share": 0.1, "margin": -0.2},
            "last": {"step": 26, "easy_share": 0.25, "margin": 0.4},
        },
    }
    text = render(cfg, metrics, "org/model")
    assert "| metric | base model as it ships | before training | after training |" in text
    assert "| nDCG@10 | 0.6985 | 0.5697 | 0.7276 |" in text
    assert "75% of rows still teaching at the end" in text


def _tiny_bi_encoder(tiny_model: Path, out: Path) -> Path:
    """The tiny BERT (with its dropout) as a sentence-transformers bi-encoder: mean pooling, modules.json."""
    from sentence_transformers import SentenceTransformer, models

    word = models.Transformer(str(tiny_model), max_seq_length=48)
    SentenceTransformer(modules=[word, models.Pooling(word.get_word_embedding_dimension())]).save(str(out))
    return out


@pytest.mark.slow
def test_two_ranks_measure_the_base_model_as_one_process_does_and_log_the_loss_curve(tmp_path, tiny_model):
    """The base figure is sharded like every search: 2 ranks give one process's figures; metrics.json keeps
    the share of easy rows at every log step, and the card the share still teaching at the end."""
    import yaml

    from tests.helpers import write_triplets
    from tests.helpers.mining import run_trainer

    base = _tiny_bi_encoder(tiny_model, tmp_path / "bi")
    beir = _beir(tmp_path / "beir", docs=40, queries=12)
    config = {
        "model": {"name_or_path": str(base), "query_length": 16, "document_length": 48},
        "data": {
            "train": {"path": str(write_triplets(tmp_path / "t.jsonl", 48))},
            "eval_beir": str(beir),
            "eval_split": "test",
        },
        "loss": {"name": "contrastive"},
        "training": {"per_device_batch_size": 4, "max_steps": 6, "learning_rate": 1e-3, "log_every": 2},
        "evaluation": {"before_training": True, "after_training": False},
        "output_dir": str(tmp_path / "out"),
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    res = run_trainer(tmp_path / "train.yaml", tmp_path, world=2)
    assert res.returncode == 0, res.stdout[-3000:]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    alone = evaluate_base(str(base), load_beir(beir, "test"), batch_size=32, device="cpu")
    assert {k: v for k, v in metrics["base"].items() if k != "seconds"} == pytest.approx(
        {k: v for k, v in alone.items() if k != "seconds"}, abs=1e-6
    )
    assert set(metrics["before"]) == {"ndcg@10", "mrr@10", "recall@100", "map@100"}
    curve = metrics["hardness"]["curve"]
    assert [c["step"] for c in curve] == [2, 4, 6]  # log_every 2, max_steps 6
    assert all(0.0 <= c["easy_share"] <= 1.0 for c in curve)
    assert curve[-1]["step"] == metrics["hardness"]["last"]["step"]
    card = (tmp_path / "out" / "final-model" / "README.md").read_text()
    assert "base model as it ships" in card and "of rows still teaching at the end" in card
