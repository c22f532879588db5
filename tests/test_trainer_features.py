"""What users of HF's Trainer expect: evaluation every N steps with a best model, tracking files,
schedules, gradient accumulation equal to the large batch, and no weight decay on biases/LayerNorm."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers import ROOT, write_triplets


def _distill_rows(path: Path, n: int) -> Path:
    rows = [
        {
            "query": f"question number {i} about topic {i % 5}",
            "documents": [f"answer {i} text", f"other {i} words", f"noise {i % 3} here"],
            "scores": [3.0, 1.0 + (i % 2), 0.0],
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _step_gradient(model: Path, data: Path, per_device: int, accumulation: int, tmp: Path) -> torch.Tensor:
    """One step's gradient through the trainer's own ``build`` and ``accumulate_gradients`` (1 process)."""
    from trainer.config.schema import TrainConfig
    from trainer.data.batches import batches
    from trainer.env import Layout
    from trainer.step import accumulate_gradients
    from trainer.train import build

    cfg = TrainConfig.model_validate(
        {
            "model": {"name_or_path": str(model), "query_length": 16, "document_length": 48},
            "data": {"train": {"path": str(data)}, "cache_dir": str(tmp / "cache")},
            "loss": {"name": "distillation"},
            "training": {
                "per_device_batch_size": per_device,
                "gradient_accumulation_steps": accumulation,
                "max_steps": 1,
                "seed": 5,
            },
        }
    )
    t = build(cfg, Layout(), torch.device("cpu"))
    accumulate_gradients(t, batches(t.data, 0, 1, 0, torch.device("cpu"), 0, 1, t.accumulation))
    return torch.cat([p.grad.reshape(-1) for p in t.params])


@pytest.mark.slow
def test_accumulation_equals_the_large_batch(tmp_path, tiny_model_no_dropout):
    data = _distill_rows(tmp_path / "d.jsonl", 16)
    big = _step_gradient(tiny_model_no_dropout, data, 8, 1, tmp_path)
    accumulated = _step_gradient(tiny_model_no_dropout, data, 4, 2, tmp_path)
    assert torch.allclose(big, accumulated, rtol=1e-5, atol=1e-7)
    small = _step_gradient(tiny_model_no_dropout, data, 4, 1, tmp_path)
    assert not torch.allclose(big, small, rtol=1e-5, atol=1e-7)  # the test can tell batches apart


@pytest.mark.parametrize("head_lr", [None, 1e-3])
def test_no_weight_decay_on_biases_and_layernorm_and_the_head_at_its_own_rate(tiny_model, head_lr):
    from trainer.config.schema import ModelConfig, TrainingConfig
    from trainer.model import build_model
    from trainer.optim import param_groups

    model = build_model(ModelConfig(name_or_path=str(tiny_model)), "cpu")
    groups = param_groups(model, TrainingConfig(learning_rate=5e-5, head_learning_rate=head_lr, weight_decay=0.01))
    decay, no_decay = groups[0]["params"], groups[1]["params"]
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(p.ndim >= 2 and "norm" not in names[id(p)].lower() for p in decay)
    assert any("LayerNorm.weight" in names[id(p)] for p in no_decay)
    assert any(names[id(p)].endswith(".bias") for p in no_decay)
    head = groups[2]["params"] if head_lr else []
    assert len(groups) == (3 if head_lr else 2)
    assert len(decay) + len(no_decay) + len(head) == sum(1 for p in model.parameters() if p.requires_grad)
    if head_lr:  # the projection, and nothing of the encoder, at the head's rate
        assert {names[id(p)] for p in head} == {"1.linear.weight"} and groups[2]["lr"] == head_lr
        optimizer = torch.optim.AdamW(groups, lr=5e-5)
        assert [g["lr"] for g in optimizer.param_groups] == [5e-5, 5e-5, head_lr]


@pytest.mark.parametrize("name", ["linear", "cosine", "constant_with_warmup"])
def test_schedules_come_from_transformers(name, tiny_model, tmp_path):
    """The trainer's own ``build`` turns ``lr_scheduler`` and ``warmup_ratio`` into the schedule it steps."""
    from trainer.config.schema import TrainConfig
    from trainer.env import Layout
    from trainer.train import build

    data = _distill_rows(tmp_path / "d.jsonl", 8)
    cfg = TrainConfig.model_validate(
        {
            "model": {"name_or_path": str(tiny_model)},
            "data": {"train": {"path": str(data)}, "cache_dir": str(tmp_path / "cache")},
            "loss": {"name": "distillation"},
            "training": {
                "lr_scheduler": name,
                "learning_rate": 0.5,
                "warmup_ratio": 0.2,
                "max_steps": 10,
                "per_device_batch_size": 4,
            },
        }
    )
    t = build(cfg, Layout(), torch.device("cpu"))
    lrs = []
    for _ in range(10):
        lrs.append(t.scheduler.get_last_lr()[0])
        t.optimizer.step()
        t.scheduler.step()
    assert lrs[0] == 0.0 and lrs[1] == pytest.approx(0.25) and lrs[2] == pytest.approx(0.5)  # 2 warm-up steps
    assert (lrs[-1] == pytest.approx(0.5)) == (name == "constant_with_warmup")
    after_warmup = {"linear": 0.5 * 6 / 8, "cosine": 0.25 * (1 + math.cos(math.pi / 4)), "constant_with_warmup": 0.5}
    assert lrs[4] == pytest.approx(after_warmup[name])  # 2 steps into the decay (of 8)


@pytest.mark.slow
def test_a_run_with_a_head_rate_logs_both_rates(tiny_model, tmp_path, caplog):
    """The log's ``lr`` is the encoder's; the projection's own rate (``training.head_learning_rate``) is logged
    beside it (``head_lr``, also in metrics.jsonl)."""
    from trainer.config.load import parse_config
    from trainer.env import Layout
    from trainer.train import run

    cfg = parse_config(
        {
            "model": {"name_or_path": str(tiny_model), "query_length": 16, "document_length": 32},
            "data": {"train": {"path": str(write_triplets(tmp_path / "t.jsonl", 16))}, "num_workers": 0}
            | {"cache_dir": str(tmp_path / "cache")},
            "training": {"per_device_batch_size": 4, "max_steps": 4, "warmup_ratio": 0.0, "learning_rate": 3e-5}
            | {"head_learning_rate": 1e-3, "log_every": 1},
            "evaluation": {"after_training": False},
            "tracking": {"report_to": ["jsonl"]},
            "output_dir": str(tmp_path / "out"),
        }
    )
    with caplog.at_level("INFO", logger="trainer"):
        run(cfg, Layout())
    lines = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "train/lr" in line]
    # as HF's Trainer logs it: the rate after the step's schedule step, the one the next step uses (the linear
    # decay ends at 0 after step 4)
    assert [line["train/lr"] for line in steps] == pytest.approx([3e-5 * f for f in (0.75, 0.5, 0.25, 0.0)])
    assert [line["train/head_lr"] for line in steps] == pytest.approx([1e-3 * f for f in (0.75, 0.5, 0.25, 0.0)])
    assert "step 1/4 loss" in caplog.text and "lr 2.25e-05 head_lr 7.50e-04" in caplog.text


@pytest.mark.slow
def test_two_process_run_evaluates_every_n_steps_keeps_the_best_and_tracks(tmp_path, tiny_model, unused_tcp_port):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from trainer.quickstart_data import build

    build(tmp_path / "qs", max_test_queries=20)
    data = write_triplets(tmp_path / "t.jsonl", 48)
    cfg = {
        "model": {"name_or_path": str(tiny_model), "query_length": 16, "document_length": 48},
        "data": {"train": {"path": str(data)}, "eval_beir": str(tmp_path / "qs" / "beir")},
        "training": {"per_device_batch_size": 4, "max_steps": 6, "learning_rate": 1e-3, "log_every": 1},
        "evaluation": {"every_steps": 2, "metric": "ndcg@10"},
        "checkpoint": {"every_steps": 100},
        "index": {},
        "output_dir": str(tmp_path / "out"),
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={unused_tcp_port}"]
    res = subprocess.run(
        [*cmd, "-m", "trainer", "--config", str(tmp_path / "train.yaml")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = tmp_path / "out"
    metrics = json.loads((out / "metrics.json").read_text())
    evals = [line for line in res.stderr.splitlines() if "INFO eval at step" in line]
    assert len(evals) == 2 and all(line.startswith("[rank 0]") for line in evals)  # steps 2 and 4, logged once
    best = metrics["best"]
    assert best["ndcg@10"] == max(best["ndcg@10"], metrics["after"]["ndcg@10"])
    assert (out / "best-model" / "model.safetensors").is_file() and (out / "final-model").is_dir()
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "train/loss" in x] == [1, 2, 3, 4, 5, 6]
    assert [x["step"] for x in lines if "eval/ndcg@10" in x] == [2, 4, 6]
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    assert {"train/loss", "train/lr", "train/grad_norm", "train/samples_per_second", "eval/ndcg@10"} <= set(
        acc.Tags()["scalars"]
    )
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3, 4, 5, 6]
    # evaluation sharded over 2 ranks gives the metrics one process gives
    from pylate import models

    from trainer.evaluate import evaluate, load_beir

    final = models.ColBERT(str(out / "final-model"), device="cpu", query_length=16, document_length=48)
    single = evaluate(final, load_beir(tmp_path / "qs" / "beir"), 32)
    for k, v in metrics["after"].items():
        assert v == pytest.approx(single[k], abs=1e-6), k
    # the PLAID index built at the end, queried like the exact search: recall@100 within 0.05 of exact
    index = metrics["index"]
    assert (out / "index").is_dir() and index["size_mb"] > 0 and index["build_seconds"] > 0
    assert abs(index["recall@100"] - metrics["after"]["recall@100"]) <= 0.05
    assert "PLAID index of" in res.stderr


@pytest.mark.parametrize(("native", "expected"), [(True, "bf16"), (False, "fp16")])
def test_auto_precision_counts_only_native_bf16(monkeypatch, native, expected):
    """A T4/V100 reports bf16 support by emulation; auto picks fp16 (with a GradScaler) there."""
    from trainer.model import choose_precision

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: native or including_emulation)
    assert choose_precision("auto", torch.device("cuda", 0)) == expected
    assert choose_precision("auto", torch.device("cpu")) == "fp32"


def test_the_pod_exit_code_keeps_the_cause_when_torchrun_says_1():
    """torchrun exits 1 for any child failure; the launcher reports the children's contract instead."""
    from trainer.errors import EXIT_CONFIG, EXIT_PEER, job_exit_code

    assert job_exit_code(0, []) == 0
    assert job_exit_code(1, [EXIT_CONFIG, EXIT_PEER]) == EXIT_CONFIG  # the bad config, not its peer's loss
    assert job_exit_code(1, [EXIT_PEER, 143]) == 143  # preempted: retryable
    assert job_exit_code(1, []) == EXIT_PEER  # killed before it could say (OOM): retryable
    assert 1 <= EXIT_CONFIG <= 127 and 128 <= EXIT_PEER <= 255
