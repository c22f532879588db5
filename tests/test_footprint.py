"""The index's footprint measured where the model is made (``index.footprint``, ``trainer/footprint.py``): real
PLAID builds and exact MaxSim over PyLate's pooled vectors on a held-out split, into metrics.json, the card and
a PNG beside the model; ``index.pool_factor`` is what the final index is built at, and a sweep can choose it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from operator_cli.cli import cli
from tests.helpers.tune import sweep_config
from tests.helpers.vectordb import save_colbert, write_corpus


@pytest.mark.slow  # six PLAID builds, three exact searches and the final index: the fast lane's longest test by far
def test_the_footprint_is_measured_recorded_and_drawn(tmp_path, tiny_model):
    from trainer import phases
    from trainer.config.load import parse_config
    from trainer.footprint import NBITS, POOL_FACTORS
    from trainer.run.checkpoint import write_manifest

    beir = write_corpus(tmp_path / "beir", documents=40, queries=8)
    out = tmp_path / "output"
    save_colbert(tiny_model, out / "final-model")
    write_manifest(out / "final-model")
    (out / "metrics.json").write_text(json.dumps({"steps": 1, "model_dir": str(out / "final-model")}))
    cfg = parse_config(
        {
            "model": {"query_length": 16, "document_length": 48},
            "data": {"train": {"path": "t.jsonl"}, "eval_beir": str(beir)},
            "training": {"max_steps": 1},
            "index": {"footprint": True, "pool_factor": 2},
            "output_dir": str(out),
        }
    )
    phases.finish(cfg, json.loads((out / "metrics.json").read_text()))
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["index"]["pool_factor"], metrics["index"]["nbits"]) == (2, 4)  # the chosen point, built
    f = metrics["footprint"]
    at = {(p["pool_factor"], p["storage"]): p for p in f["points"]}
    storages = ["float32", *(f"plaid {n}-bit" for n in NBITS)]
    assert set(at) == {(pool, s) for pool in POOL_FACTORS for s in storages}
    tokens = [at[(pool, "float32")]["tokens_per_document"] for pool in POOL_FACTORS]
    assert tokens[0] > tokens[1] > tokens[2]  # PyLate's pooling keeps about 1/pool_factor of the tokens
    assert metrics["index"]["tokens_per_document"] == tokens[1]  # the final index holds the pooled vectors
    for pool in POOL_FACTORS:
        assert at[(pool, "plaid 2-bit")]["bytes_per_document"] < at[(pool, "plaid 4-bit")]["bytes_per_document"]
        assert all(at[(pool, s)]["disk_bytes_per_document"] >= at[(pool, s)]["bytes_per_document"] for s in storages)
        f32 = at[(pool, "float32")]  # 4 bytes x 128 dimensions a token (tokens rounded to 2 decimals)
        assert abs(f32["bytes_per_document"] - 4 * 128 * f32["tokens_per_document"]) <= 4
        assert all(0 <= at[(pool, s)]["ndcg@10"] <= 1 and 0 <= at[(pool, s)]["recall@100"] <= 1 for s in storages)
    assert f["chosen"] == {"pool_factor": 2, "storage": "plaid 4-bit"}
    assert f["lines"][0].startswith("at pool factor 2, ") and "of the bytes for" in f["lines"][0]
    png = out / "final-model" / "footprint.png"
    assert f["png"] == "footprint.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    card = (out / "final-model" / "README.md").read_text()
    assert "## Index footprint" in card and f["lines"][0] in card and "](footprint.png)" in card
    assert phases.redo_from(cfg) == (None, "")  # the model's manifest holds the PNG and the card
    assert not list(out.glob(".tmp-*"))  # the footprint's index builds leave nothing behind


def test_a_sweep_can_choose_the_pool_factor(tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text(sweep_config("{max_steps: 4}", "index: {nbits: 4}"))
    args = ["tune", "--config", str(config), "--param", "index.pool_factor=choice(1,2)", "--trials", "4", "--local"]
    res = CliRunner().invoke(cli, [*args, "--dry-run", "-o", "json", "--workdir", str(tmp_path / "wd")])
    assert res.exit_code == 0, res.output
    values = {t["values"]["index.pool_factor"] for t in json.loads(res.output)["trials"]}
    assert values <= {1, 2} and values
    res = CliRunner().invoke(cli, [*args[:4], "--param", "index.pool_factor=choice(1,9)", "--local", "--dry-run"])
    assert res.exit_code == 2 and "index.pool_factor" in res.output
