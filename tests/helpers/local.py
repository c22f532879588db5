"""A working directory laid out like a pod's /workspace, and the `colbert-k8s local` command that runs a job on it."""

from __future__ import annotations

import sys
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


def local_command(config: Path, name: str, workdir: Path, *flags: str) -> list[str]:
    """``colbert-k8s local`` as a fresh interpreter runs it: the job ``name`` of ``config`` on CPU replicas under
    ``workdir``; ``flags`` give its shape (``--nodes``, ``--elastic``), storage and environment."""
    cli = [sys.executable, "-m", "operator_cli.cli", "local", "--config", str(config), "--name", name]
    return [*cli, "--gpus-per-node", "0", "--workdir", str(workdir), *flags]


def s3_flags(endpoint: str) -> list[str]:
    """The flags that give a local job's pods an S3 emulator: its keys as Secret references (``local`` reads their
    values from the caller's environment: pass ``MotoS3.env``), its endpoint and region as plain variables."""
    secrets = ["--secret-env", "AWS_ACCESS_KEY_ID=s3/id", "--secret-env", "AWS_SECRET_ACCESS_KEY=s3/secret"]
    return [*secrets, "--env", f"AWS_ENDPOINT_URL={endpoint}", "--env", "AWS_REGION=us-east-1"]
