"""A local sweep end to end (the issue's "done when"): 4 trials on the quickstart data (2 learning rates x 2
negative counts, a few steps of a tiny model), the trial table, the best trial's model exported with its card;
killed after its second trial and run again, it finishes without running trials 1 and 2 again. And ``tune
status``'s best checked against the trials' own ``metrics.json``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers.stores import MotoS3, moto_available

CLI = [sys.executable, "-m", "operator_cli.cli"]


def _workspace(wd: Path, model: Path) -> Path:
    """The quickstart data with a dev split (its test qrels stand in), and a config of a few steps."""
    from trainer.quickstart_data import build

    build(wd / "data" / "quickstart", max_test_queries=40)
    qrels = wd / "data" / "quickstart" / "beir" / "qrels"
    (qrels / "dev.tsv").write_text((qrels / "test.tsv").read_text())
    cfg = {
        "model": {"name_or_path": str(model), "query_length": 16, "document_length": 48},
        "data": {
            "train": {"path": "data/quickstart/train.jsonl", "limit": 48},
            "eval_beir": "data/quickstart/beir",
            "eval_split": "dev",
            "num_workers": 0,
        },
        "mine": {"retriever": "bm25", "negatives": 1},
        "training": {"per_device_batch_size": 8, "max_steps": 2, "learning_rate": 1e-3, "log_every": 1},
        "checkpoint": {"every_steps": 1},
        "tracking": {"report_to": ["jsonl"]},
        "export": {"destination": "s3://models/colbert/best/"},
        "output_dir": "output",
    }
    (wd / "train.yaml").write_text(yaml.safe_dump(cfg))
    return wd / "train.yaml"


def _tune(config: Path, wd: Path) -> list[str]:
    return [
        *CLI,
        "tune",
        "--config",
        str(config),
        "--name",
        "qs",
        "--algorithm",
        "grid",
        "--local",
        "--param",
        "training.learning_rate=choice(1e-4,1e-3)",
        "--param",
        "mine.negatives=choice(1,2)",
        "--gpus-per-node",
        "0",
        "--workdir",
        str(wd),
    ]


@pytest.mark.slow
@pytest.mark.skipif(moto_available() is not None, reason=str(moto_available()))
def test_a_local_sweep_resumes_without_rerunning_and_exports_the_best(tmp_path, tiny_model):
    wd = tmp_path / "wd"
    config = _workspace(wd, tiny_model)
    s3 = MotoS3()
    try:
        s3.bucket("models")
        env = {**os.environ, **s3.env, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        first = subprocess.Popen(
            _tune(config, wd), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        seen = []
        for line in first.stdout:
            seen.append(line)
            if line.startswith("qs-t2 ") and "Running" not in line:
                first.send_signal(signal.SIGKILL)  # after its second trial ended: no goodbye, no cleanup
                break
        first.wait()
        assert any(line.startswith("qs-t1 ") and "Succeeded" in line for line in seen), "".join(seen)
        root = wd / "tune" / "qs"
        kept = {t: (root / t / "output" / "metrics.json").stat().st_mtime_ns for t in ("qs-t1", "qs-t2")}
        logs = {t: (root / t / "log.txt").stat().st_size for t in ("qs-t1", "qs-t2")}
        time.sleep(2)  # the third trial got SIGTERM with its parent's death
        second = subprocess.run(_tune(config, wd), env=env, capture_output=True, text=True, timeout=1200)
        out = second.stdout
        assert second.returncode == 0, out + second.stderr
        rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("qs-t")}
        assert "finished before; kept" in rows["qs-t1"] and "finished before; kept" in rows["qs-t2"], out
        assert "Succeeded" in rows["qs-t3"] and "Succeeded" in rows["qs-t4"], out
        for t in ("qs-t1", "qs-t2"):  # not run again: its outputs and its log untouched
            assert (root / t / "output" / "metrics.json").stat().st_mtime_ns == kept[t]
            assert (root / t / "log.txt").stat().st_size == logs[t]

        figures = {
            t: json.loads((root / t / "output" / "metrics.json").read_text())["after"]["ndcg@10"]
            for t in ("qs-t1", "qs-t2", "qs-t3", "qs-t4")
        }
        best = max(figures, key=figures.get)
        assert f"best: {best} ndcg@10 {figures[best]:.4f}" in out
        status = subprocess.run(
            [*CLI, "tune", "status", "qs", "--workdir", str(wd), "-o", "json"], env=env, capture_output=True, text=True
        )
        record = json.loads(status.stdout)
        assert record["best"]["name"] == best and record["best"]["metric"] == figures[best]

        remote = s3.objects("models", "colbert/best/")
        assert "colbert-k8s-export.json" in remote and "model.safetensors" in remote
        exported = json.loads(remote["metrics.json"])
        assert exported["after"]["ndcg@10"] == figures[best] and exported["sweep"]["trial"] == best
        card = remote["README.md"].decode()
        assert "## Sweep" in card and f"`{best}`" in card and "choice(0.0001, 0.001)" in card
    finally:
        s3.close()


def test_a_resumed_sweep_waits_for_a_trials_earlier_replay_to_let_go(tmp_path, capsys):
    """A killed sweep's orphaned trial checkpoints on SIGTERM and still holds its workspace for a while; the
    resumed sweep waited 0 s, and recorded the trial as failed ("in use by another replay") under load."""
    from operator_cli.local.run import LOCK_FILE
    from operator_cli.tune.local import _wait_for_previous_replay

    # The holder marks the moment it lets go, then lives on: whether the wait returned before that moment is then
    # read from the marker, not from the holder's exit (its lock is freed at teardown, before it is reaped).
    hold = """
import pathlib, sys, time
from filelock import FileLock
lock = FileLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
time.sleep(2)
pathlib.Path(sys.argv[2]).touch()
lock.release()
time.sleep(60)
"""
    released = tmp_path / "released"
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(tmp_path / LOCK_FILE), str(released)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        _wait_for_previous_replay(tmp_path, "qs-t3")
        assert released.exists()  # it returned only once the earlier replay had let go
    finally:
        holder.kill()
        holder.wait()
    assert "qs-t3: waiting for its earlier replay" in capsys.readouterr().err
