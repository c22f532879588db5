"""``model.query_length: auto`` (trainer/query_length.py): chosen from the training queries, the same on every
rank, carried into the saved model, metrics.json and the card; a ColBERT base keeps its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers.mining import run_trainer
from trainer.config.load import parse_config
from trainer.config.schema import ConfigError


def _job(tmp: Path, model: Path, data: Path, query_length="auto") -> Path:
    cfg = {
        "model": {"name_or_path": str(model), "query_length": query_length, "document_length": 48},
        "data": {"train": {"path": str(data)}},
        "training": {"per_device_batch_size": 4, "max_steps": 2, "learning_rate": 1e-3, "log_every": 1},
        "checkpoint": {"every_steps": 100},
        "evaluation": {"after_training": False},
        "output_dir": str(tmp / "out"),
    }
    path = tmp / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _queries(path: Path, lengths: list[int]) -> Path:
    """Rows whose queries have about the given numbers of words (one token each in the tiny BERT's vocabulary)."""
    rows = [{"query": " ".join(["list"] * n), "positive": f"document {i} about lists"} for i, n in enumerate(lengths)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.slow
def test_auto_takes_the_length_that_holds_the_training_queries_on_every_rank(tmp_path, tiny_model):
    """Queries of 3 words but one of 30: 95% fit in 8 tokens ([CLS], [Q], 3 words, [SEP] = 6), so the job trains,
    saves and reports 8, with its reason, on one rank and on two alike."""
    data = _queries(tmp_path / "pairs.jsonl", [3] * 39 + [30])
    for world in (1, 2):
        ws = tmp_path / f"w{world}"
        ws.mkdir()
        res = run_trainer(_job(ws, tiny_model, data), ws, world)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
        why = "query_length 8 (auto): 98% of 40 training queries fit (median 6 tokens with the [Q] marker)"
        assert why in res.stdout
        out = ws / "out"
        saved = json.loads((out / "final-model" / "config_sentence_transformers.json").read_text())
        assert saved["query_length"] == 8  # what serving and the index read
        assert json.loads((out / "metrics.json").read_text())["auto"] == {"query_length": why}
        assert f"queries 8, documents 48 tokens; {why}" in (out / "final-model" / "README.md").read_text()
        assert json.loads((out / "job-config.json").read_text())["model"]["query_length"] == 8


def test_auto_holds_most_queries_up_to_pylates_32_and_a_colbert_keeps_its_own(tmp_path, tiny_model):
    from trainer.config.schema import ModelConfig
    from trainer.model import build_model
    from trainer.query_length import resolved

    data = _queries(tmp_path / "long.jsonl", [10] * 19 + [30])  # 13 tokens with the marker, 33 for one
    cfg = parse_config(yaml.safe_load(_job(tmp_path, tiny_model, data).read_text()))
    chosen, why = resolved(cfg)
    assert chosen.model.query_length == 16 and why.startswith("query_length 16 (auto): 95% of 20")
    longer = _queries(tmp_path / "longer.jsonl", [30] * 20)  # 33 tokens: never past PyLate's 32
    chosen, why = resolved(parse_config(yaml.safe_load(_job(tmp_path, tiny_model, longer).read_text())))
    assert chosen.model.query_length == 32 and why.startswith("query_length 32 (auto): 0% of 20")
    assert resolved(cfg.model_copy(update={"model": cfg.model.model_copy(update={"query_length": 24})})) == (
        cfg.model_copy(update={"model": cfg.model.model_copy(update={"query_length": 24})}),
        None,
    )  # a number is left as it is

    mined = yaml.safe_load(_job(tmp_path, tiny_model, data).read_text())  # a distillation job mines from pairs
    mined |= {
        "loss": {"name": "distillation"},
        "mine": {"retriever": "bm25", "teacher": {"name_or_path": str(tiny_model)}},
    }
    assert resolved(parse_config(mined))[0].model.query_length == 16  # its pairs have no scores: read as pairs

    colbert = tmp_path / "colbert"
    build_model(ModelConfig(name_or_path=str(tiny_model), query_length=24, document_length=48), "cpu").save(
        str(colbert)
    )
    cfg = parse_config(yaml.safe_load(_job(tmp_path, colbert, data).read_text()))
    chosen, why = resolved(cfg)
    assert chosen.model.query_length == 24 and "the base model is a ColBERT" in why


@pytest.mark.parametrize("value", ["automatic", 2, 9000])
def test_a_bad_query_length_is_one_line(value):
    with pytest.raises(ConfigError) as e:
        parse_config({"data": {"train": {"path": "t.jsonl"}}, "model": {"query_length": value}})
    assert "'model.query_length'" in str(e.value) and "'auto'" in str(e.value) and "\n" not in str(e.value)
