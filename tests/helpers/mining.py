"""Configs for mining: pairs without negatives, and a whole tiny job with a ``mine:`` section; and a run of
the trainer as ``world`` one-process pods (exit code the worst rank's, stdout rank 0's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from tests.helpers import free_port
from trainer.config.load import parse_config
from trainer.config.schema import TrainConfig


def pairs_config(tmp_path: Path, rows: list[dict], **mine) -> TrainConfig:
    """A config whose data.train is ``rows`` (written beside it) and whose ``mine:`` is ``mine``."""
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return parse_config(
        {
            "data": {"train": {"path": str(data)}, "cache_dir": str(tmp_path / "cache")},
            "training": {"max_steps": 1},
            "mine": mine,
        }
    )


def mining_job(tmp: Path, model: Path, data: Path, **mine) -> Path:
    cfg = {
        "model": {"name_or_path": str(model), "query_length": 16, "document_length": 48},
        "data": {"train": {"path": str(data)}, "cache_dir": str(tmp / "cache")},
        "training": {"per_device_batch_size": 4, "max_steps": 2, "seed": 5},
        "checkpoint": {"every_steps": 1},
        "evaluation": {"after_training": False},
        "mine": {
            "top_k": 20,
            "rank_range": [2, 12],
            "negatives": 2,
            "max_score_ratio": 1.0,
            "batch_size": 16,
            "query_chunk": 16,
            **mine,
        },  # a random tiny model scores everything alike: no ratio filter
        "output_dir": str(tmp / "out"),
    }
    path = tmp / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_trainer(config: Path, cwd: Path, world: int = 1) -> subprocess.CompletedProcess:
    from tests.helpers.pods import pod_env

    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "trainer", "--config", str(config)],
            cwd=cwd,
            env=pod_env(rank, world, port),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world)
    ]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    return subprocess.CompletedProcess(["trainer"], max(p.returncode for p in procs), outs[0], "\n".join(outs[1:]))
