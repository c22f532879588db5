"""An output directory as a finished job leaves it (model, optional index, metrics), and the config that
points at it: what the phase markers and manifests are checked against."""

from __future__ import annotations

import json
from pathlib import Path

from trainer.config.schema import TrainConfig
from trainer.run.checkpoint import write_manifest


def fake_output(out: Path, index: bool) -> None:
    """An output_dir as a finished job leaves it, written by the production manifest code."""
    (out / "final-model" / "1_Dense").mkdir(parents=True)
    (out / "final-model" / "model.safetensors").write_bytes(b"\x00" * 64)
    (out / "final-model" / "1_Dense" / "config.json").write_text("{}")
    write_manifest(out / "final-model")
    metrics = {"steps": 2, "model_dir": str(out / "final-model")}
    if index:
        (out / "index" / "colbert").mkdir(parents=True)
        (out / "index" / "colbert" / "ivf.pt").write_bytes(b"\x01" * 32)
        write_manifest(out / "index")
        metrics["index"] = {"ndcg@10": 0.5}
    (out / "metrics.json").write_text(json.dumps(metrics))


def phases_config(out: Path, index: bool, beir: str = "beir") -> TrainConfig:
    """A config whose output_dir is ``out``, with an index phase when ``index``."""
    from trainer.config.load import parse_config

    cfg = {
        "data": {"train": {"path": "t.jsonl"}, "eval_beir": beir},
        "training": {"max_steps": 2},
        "output_dir": str(out),
        **({"index": {}} if index else {}),
    }
    return parse_config(cfg)
