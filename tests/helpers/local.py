"""A working directory laid out like a pod's /workspace, and the `colbert-k8s local` command that runs a job on it."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
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


def run_job(cmd: list[str], timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True)``, except that a job still running after ``timeout``
    fails the test with where it hangs: every trainer below it is sent SIGUSR1 (each prints its threads' stacks,
    trainer/cli.py), then the command SIGTERM (SIGKILL a minute later: its reaper cleans up), and the output's
    tail is the failure message."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for p in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                command = " ".join(p.cmdline())  # a trainer, not torchrun's agent (SIGUSR1 would end it)
                if "trainer" in command and "torch.distributed.run" not in command:
                    p.send_signal(signal.SIGUSR1)
        time.sleep(3)  # the stacks reach the pipes
        proc.terminate()  # `local` stops its replicas and removes what it made, as on Ctrl-C
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()  # its reaper, left alive, ends the replicas and removes the namespaces
            out, err = proc.communicate()
        where = f"{' '.join(cmd[:6])} ... still running after {timeout}s"
        pytest.fail(f"{where}; the trainers' stacks and the output:\n{out[-8000:]}\n{err[-2000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
