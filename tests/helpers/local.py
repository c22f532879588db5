"""A working directory laid out like a pod's /workspace, for `colbert-k8s local` runs."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.helpers import write_triplets


def local_workdir(tmp: Path, model: Path, n_rows: int, over: dict | None = None) -> Path:
    """A workdir laid out like the /workspace volume: data/ plus a config with relative paths."""
    (tmp / "data").mkdir(parents=True, exist_ok=True)
    write_triplets(tmp / "data" / "train.jsonl", n_rows)
    cfg = {
        "model": {"name_or_path": str(model), "query_length": 16, "document_length": 48},
        "data": {"train": {"path": "data/train.jsonl"}},
        "training": {"per_device_batch_size": 4, "max_steps": 4, "learning_rate": 1e-3, "log_every": 1},
        "checkpoint": {"every_steps": 2},
        "evaluation": {"after_training": False},
        "output_dir": "output",
    }
    for key, value in (over or {}).items():
        section, _, leaf = key.partition(".")
        cfg[section][leaf] = value
    (tmp / "train.yaml").write_text(yaml.safe_dump(cfg))
    return tmp
