"""The trainer end to end: bad input, a real 2-process gloo run, and kill-and-resume."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.helpers import ROOT, write_triplets


def _config(tmp: Path, model: Path, data: Path, over: dict | None = None) -> Path:
    cfg = {
        "model": {"name_or_path": str(model), "query_length": 16, "document_length": 48},
        "data": {"train": {"path": str(data)}},
        "loss": {"name": "contrastive"},
        "training": {"per_device_batch_size": 4, "max_steps": 6, "learning_rate": 1e-3, "log_every": 2},
        "checkpoint": {"every_steps": 2, "keep_last": 2},
        "evaluation": {"after_training": False},
        "output_dir": str(tmp / "out"),
    }
    for key, value in (over or {}).items():
        section, _, leaf = key.partition(".")
        if leaf:
            cfg[section][leaf] = value
        else:
            cfg[section] = value
    path = tmp / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train(config: Path, nproc: int, port: int, **kw) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "trainer", "--config", str(config)]
    if nproc > 1:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={nproc}",
            f"--master_port={port}",
            "-m",
            "trainer",
            "--config",
            str(config),
        ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env, **kw)


BAD_CONFIGS = [
    ("unknown-key", {"training.per_device_batchsize": 4}, "unknown key 'training.per_device_batchsize'"),
    ("wrong-type", {"training.max_steps": "many"}, "'training.max_steps'"),
    ("missing-data-file", {"data": {"train": {"path": "/nonexistent/train.jsonl"}}}, "training data not found"),
    ("bad-loss", {"loss": {"name": "triplet"}}, "'loss'"),
    # each was a FileNotFoundError/NotADirectoryError traceback from a mkdir deep in the run
    (
        "output-dir-under-a-file",
        {"output_dir": "{tmp}/t.jsonl/out"},
        "output_dir {tmp}/t.jsonl/out cannot be created or written",
    ),
    (
        "cache-dir-under-a-file",
        {"data": {"train": {"path": "{tmp}/t.jsonl"}, "cache_dir": "{tmp}/t.jsonl/c"}},
        "data.cache_dir {tmp}/t.jsonl/c cannot be created or written",
    ),
]


@pytest.mark.parametrize("name,over,message", BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_is_one_line(name, over, message, tmp_path, tiny_model):
    data = write_triplets(tmp_path / "t.jsonl", 8)
    over = yaml.safe_load(yaml.safe_dump(over).replace("{tmp}", str(tmp_path)))
    res = _train(_config(tmp_path, tiny_model, data, over), 1, 0)
    assert res.returncode == 2
    assert message.replace("{tmp}", str(tmp_path)) in res.stderr
    assert "Traceback" not in res.stderr
    errors = [line for line in res.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1


BAD_ROWS = [
    ("empty-dataset", "", "the dataset is empty"),
    # plain (query, positive) pairs train with in-batch negatives (issue 43); a missing positive is an error
    ("missing-column", '{"query": "q", "negative": "n"}\n', "row 1: column 'positive' is missing"),
    (
        "empty-column",
        '{"query": "q", "positive": "p", "negative": "n"}\n{"query": " ", "positive": "p", "negative": "n"}\n',
        "row 2: column 'query' is empty",
    ),
    ("not-json", '{"query": "q", \n', "row 1: not valid JSON"),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,content,message", BAD_ROWS, ids=[c[0] for c in BAD_ROWS])
def test_bad_data_names_file_and_row(name, content, message, tmp_path, tiny_model):
    data = tmp_path / "bad.jsonl"
    data.write_text(content)
    res = _train(_config(tmp_path, tiny_model, data), 1, 0)
    assert res.returncode == 2, res.stderr[-2000:]
    assert str(data) in res.stderr and message in res.stderr
    assert "Traceback" not in res.stderr


def test_missing_config_file(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", str(tmp_path / "nope.yaml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2 and "config file not found" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.slow
def test_bad_environment_is_one_line(tmp_path, tiny_model):
    data = write_triplets(tmp_path / "t.jsonl", 8)
    cfg = _config(tmp_path, tiny_model, data)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "3", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    res = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", str(cfg)], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert res.returncode == 2 and "RANK=3 must be below WORLD_SIZE=2" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_two_process_training_end_to_end(tmp_path, tiny_model, unused_tcp_port):
    from pylate import models

    data = write_triplets(tmp_path / "t.jsonl", 48)
    from trainer.quickstart_data import build

    build(tmp_path / "qs", max_test_queries=20)
    beir = tmp_path / "qs" / "beir"
    cfg = _config(tmp_path, tiny_model, data, {"data.eval_beir": str(beir), "evaluation": {"before_training": True}})
    res = _train(cfg, 2, unused_tcp_port)
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["steps"] == 6 and metrics["world_size"] == 2 and metrics["global_batch"] == 8
    assert set(metrics["after"]) == {"ndcg@10", "mrr@10", "recall@100", "map@100"}
    assert "[rank 0]" in res.stderr and "[rank 1]" in res.stderr
    assert "= global batch 8; in-batch negatives per query 15 (gathered across ranks" in res.stderr
    eval_lines = [line for line in res.stderr.splitlines() if "eval after training" in line]
    assert len(eval_lines) == 1 and eval_lines[0].startswith("[rank 0]")  # evaluated once, not per rank
    # how hard the negatives still are, over both ranks' rows: in the log, metrics.json and the card
    step_lines = [line for line in res.stderr.splitlines() if " step 6/6 loss " in line and "[rank 0]" in line]
    assert len(step_lines) == 1 and " margin " in step_lines[0] and "% " not in step_lines[0].split("easy")[0]
    hard = metrics["hardness"]["last"]
    assert hard["step"] == 6 and 0.0 <= hard["easy_share"] <= 1.0 and math.isfinite(hard["margin"])
    assert "negatives' hardness" in (tmp_path / "out" / "final-model" / "README.md").read_text()
    model = models.ColBERT(str(tmp_path / "out" / "final-model"), device="cpu")
    emb = model.encode(["a query"], is_query=True)
    assert emb[0].shape[-1] == 128


@pytest.mark.slow
def test_killed_rank_resumes_from_last_checkpoint(tmp_path, tiny_model, unused_tcp_port):
    from trainer.run.checkpoint import list_checkpoints, load_checkpoint

    data = write_triplets(tmp_path / "t.jsonl", 96)
    cfg = _config(
        tmp_path, tiny_model, data, {"training.max_steps": 40, "checkpoint": {"every_steps": 5, "keep_last": 3}}
    )
    ckpts = tmp_path / "out" / "checkpoints"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={unused_tcp_port}",
        "-m",
        "trainer",
        "--config",
        str(cfg),
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 240
    while not any(s >= 10 for s, _ in list_checkpoints(ckpts)):
        assert proc.poll() is None and time.time() < deadline, "training ended before it could be killed"
        time.sleep(0.05)
    children = psutil.Process(proc.pid).children(recursive=True)
    victim = max(children, key=lambda p: p.pid)  # the rank-1 worker
    victim.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=240) != 0
    killed_at = max(s for s, _ in list_checkpoints(ckpts))

    res = _train(cfg, 2, unused_tcp_port)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"resumed from {ckpts / f'step-{killed_at:08d}'} at step {killed_at}/40" in res.stderr
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["steps"] == 40
    for step, path in list_checkpoints(ckpts):  # every kept checkpoint loads, with its own step
        assert load_checkpoint(path)["step"] == step


@pytest.mark.slow
def test_distillation_run_learns_the_teachers_scores(tmp_path, tiny_model):
    """A run of the distillation loss moves the student towards the teacher: on 8 rows seen again and again
    the KL between the two score distributions, as the trainer logs it, falls by a third or more. It only
    echoed ``loss: distillation`` before; a loss whose gradient does not reach the model stays where it began."""
    rows = [
        {"query": f"question {i}", "documents": [f"answer {i}", f"other {i}", f"noise {i}"], "scores": [3.0, 1.0, 0.0]}
        for i in range(8)
    ]
    data = tmp_path / "distill.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    over = {"loss": {"name": "distillation"}, "training.max_steps": 16, "training.log_every": 1}
    res = _train(_config(tmp_path, tiny_model, data, over), 1, 0)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["loss"] == "distillation"
    losses = [float(m) for m in re.findall(r"step \d+/16 loss ([-\d.e+]+)", res.stdout + res.stderr)]
    assert len(losses) == 16 and all(math.isfinite(x) and x >= 0 for x in losses), losses
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < 0.67 * first, losses


@pytest.mark.slow
def test_training_imports_no_indexing_code(tiny_model):
    code = (
        "import sys, torch\n"
        "from trainer import train, losses, evaluate, data, model\n"
        "from trainer.run import checkpoint\n"
        "from trainer.config.schema import ModelConfig\n"
        f"model.build_model(ModelConfig(name_or_path={str(tiny_model)!r}), torch.device('cpu'))\n"
        "print(sorted(m for m in sys.modules if m.startswith(('fast_plaid', 'pylate.indexes', 'pylate.retrieve'))))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "[]"
