"""The trainer as issue 43's first hour met it: plain (query, positive) pairs train without `mine:`, every
section's missing file is found at start, metrics.json names no absolute local path, and the card carries a
license, the evaluation set's real name and a snippet that loads the model from where it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT, write_triplets


def _trainer(tmp: Path, cfg: dict) -> subprocess.CompletedProcess:
    """``colbert-train`` run from ``tmp`` (the job's volume), the config's paths relative to it."""
    (tmp / "train.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "trainer", "--config", "train.yaml"]
    return subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=300, env=env)


def _pairs(path: Path, n: int) -> None:
    rows = [json.loads(line) for line in write_triplets(path, n).read_text().splitlines()]
    path.write_text("".join(json.dumps({"query": r["query"], "positive": r["positive"]}) + "\n" for r in rows))


def _strings(value) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


@pytest.mark.slow
def test_plain_pairs_train_and_the_outputs_name_no_local_path(tmp_path, tiny_model):
    from huggingface_hub import ModelCard

    from trainer.quickstart_data import build

    _pairs(tmp_path / "pairs.jsonl", 16)
    build(tmp_path / "qs", max_test_queries=10)
    res = _trainer(
        tmp_path,
        {
            "model": {"name_or_path": str(tiny_model), "query_length": 16, "document_length": 48, "license": "mit"},
            "data": {"train": {"path": "pairs.jsonl"}, "eval_beir": "qs/beir"},
            "training": {"per_device_batch_size": 4, "max_steps": 2, "log_every": 1},
            "output_dir": "out",
        },
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "no 'negative' column: plain (query, positive) pairs, trained with in-batch negatives" in res.stderr
    assert "in-batch negatives per query 3 (this rank only" in res.stderr  # 4 queries x 1 document - 1
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["model_dir"] == "out/final-model"
    assert not [s for s in _strings(metrics) if s.startswith("/") or str(tmp_path) in s]
    done = [line for line in res.stderr.splitlines() if "done: model at out/final-model" in line]
    assert done and res.stderr.index("final model saved") < res.stderr.index(done[0])
    card = ModelCard((tmp_path / "out" / "final-model" / "README.md").read_text())
    assert card.data.license == "mit"
    assert "On `qs` (test split)" in card.text and card.data.eval_results[0].dataset_name == "qs"
    assert 'models.ColBERT(model_name_or_path="out/final-model")' in card.text


@pytest.mark.slow
def test_a_missing_eval_set_is_found_before_mining(tmp_path, tiny_model):
    """data.eval_beir was read only when the first evaluation came, after mining: now at start, in one line."""
    _pairs(tmp_path / "pairs.jsonl", 8)
    res = _trainer(
        tmp_path,
        {
            "model": {"name_or_path": str(tiny_model)},
            "data": {"train": {"path": "pairs.jsonl"}, "eval_beir": "data/nfcorpus"},
            "mine": {"retriever": "bm25", "negatives": 1, "rank_range": [1, 5]},
            "training": {"max_steps": 1},
        },
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert "data.eval_beir: data/nfcorpus/corpus.jsonl not found" in res.stderr
    assert "Traceback" not in res.stderr and "mine" not in res.stderr.lower().replace("mine:", "")


def test_the_license_is_the_configs_else_the_base_models(tmp_path):
    from trainer.config.load import parse_config
    from trainer.storage.card import license_of

    base = tmp_path / "base"
    base.mkdir()
    (base / "README.md").write_text("---\nlicense: cc-by-4.0\nlibrary_name: sentence-transformers\n---\n# base\n")
    data = {"data": {"train": {"path": "t.jsonl"}}, "training": {"max_steps": 1}}
    assert license_of(parse_config({**data, "model": {"name_or_path": str(base)}})) == "cc-by-4.0"
    assert license_of(parse_config({**data, "model": {"name_or_path": str(base), "license": "mit"}})) == "mit"
    assert license_of(parse_config({**data, "model": {"name_or_path": str(tmp_path)}})) is None  # no card
    assert license_of(parse_config(data)) == "apache-2.0"  # the quickstart's MiniLM, from its packaged card
