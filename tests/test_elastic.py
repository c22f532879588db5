"""Elastic jobs (issue 19, part 1): with training.global_batch_size a job has the same mathematics on any
world size, and a checkpoint of W ranks resumes on W' ranks."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.helpers import free_port, make_tiny_bert, write_triplets
from tests.helpers.pods import last_log, start_pods, wait_pods
from tests.helpers.states import linear_state
from trainer.config.load import parse_config
from trainer.config.schema import ConfigError
from trainer.scale import job_scale, micro_batches


def _cfg(loss: str = "contrastive", **training):
    return parse_config(
        {"data": {"train": {"path": "t"}}, "loss": {"name": loss}, "training": {"max_steps": 1, **training}}
    )


def test_the_global_batch_fixes_the_split_on_every_world_size():
    cfg = _cfg(global_batch_size=32)
    assert [micro_batches(cfg, w) for w in (1, 2, 4, 8)] == [(32, 1), (16, 1), (8, 1), (4, 1)]
    assert {job_scale(cfg, w).global_batch for w in (1, 2, 4, 8)} == {32}
    with pytest.raises(ConfigError) as e:
        micro_batches(cfg, 3)
    assert "cannot be split over 3 processes; world sizes that work: 1, 2, 4, 8, 16, 32" in str(e.value)
    # distillation sums over micro-batches: a micro-batch is capped by per_device_batch_size, accumulation fills
    distill = _cfg("distillation", global_batch_size=32, per_device_batch_size=8)
    assert micro_batches(distill, 1) == (8, 4) and micro_batches(distill, 2) == (8, 2)
    assert micro_batches(_cfg(per_device_batch_size=5), 3) == (5, 1)  # without it: the config's own numbers
    with pytest.raises(ConfigError, match="remove training.gradient_accumulation_steps"):
        _cfg(global_batch_size=32, gradient_accumulation_steps=2)


def test_another_world_size_is_refused_without_a_global_batch(tmp_path):
    from trainer.run.resume import CheckpointError, check_compatible

    fixed, plain = _cfg(global_batch_size=8), _cfg()
    state = {"world_size": 2, "config": fixed.model_dump(mode="json")}
    check_compatible(tmp_path, state, fixed, 1)  # elastic: accepted
    with pytest.raises(CheckpointError, match="set training.global_batch_size"):
        check_compatible(tmp_path, {"world_size": 2, "config": plain.model_dump(mode="json")}, plain, 1)


@pytest.mark.parametrize(
    ("key", "default", "other"),
    [("batch_sampler", "random", "no_duplicates"), ("head_only_steps", 0, 2), ("negatives_per_row", None, 1)],
)
def test_a_checkpoint_of_a_removed_lever_is_refused_unless_it_ran_as_this_trainer_does(tmp_path, key, default, other):
    """A build before 0.4.0 could write a checkpoint with another epoch order, head-only start or share of each
    row's negatives: resuming it here would train another way, so it is refused in one line. One with the
    lever at the value this trainer runs as, or older than the lever (0.3), resumes."""
    from trainer.run.resume import CheckpointError, check_compatible

    cfg = parse_config({"data": {"train": {"path": "t"}}, "training": {"max_steps": 4}})
    saved = cfg.model_dump(mode="json")
    check_compatible(tmp_path, {"world_size": 1, "config": saved}, cfg, 1)  # 0.3: no such key
    saved["training"][key] = default
    check_compatible(tmp_path, {"world_size": 1, "config": saved}, cfg, 1)
    saved["training"][key] = other
    with pytest.raises(CheckpointError, match=f"training.{key}={other!r}, which 0.4.0 removed") as e:
        check_compatible(tmp_path, {"world_size": 1, "config": saved}, cfg, 1)
    assert "\n" not in str(e.value) and "use a new output_dir" in str(e.value)


STEPS = 12


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("elastic")
    model = make_tiny_bert(tmp / "model", dropout=0.0)  # equal within float tolerance needs no masks
    data = write_triplets(tmp / "train.jsonl", 96)
    cfg = {
        "model": {"name_or_path": str(model), "query_length": 16, "document_length": 48},
        "data": {"train": {"path": str(data)}},
        "training": {
            "per_device_batch_size": 4,
            "global_batch_size": 8,
            "max_steps": STEPS,
            "learning_rate": 1e-3,
            "log_every": 1,
        },
        "checkpoint": {"every_steps": 3, "keep_last": 5},
        "evaluation": {"after_training": False},
        "distributed": {"peer_timeout_seconds": 10},
        "output_dir": "out",
    }
    path = tmp / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return tmp, path


def _weights(ws: Path) -> dict[str, torch.Tensor]:
    return load_file(ws / "out" / "final-model" / "model.safetensors")


def _close(a: dict, b: dict) -> float:
    """||a - b|| / ||b|| over the whole model. Not per tensor: the attention key biases start at 0 and
    their gradient is 0 in exact arithmetic (softmax ignores a shift), so Adam turns float noise there into
    steps of ~1e-8 that are large next to a zero tensor and nothing next to the model."""
    diff = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in b) ** 0.5
    return diff / sum(float(b[k].double().pow(2).sum()) for k in b) ** 0.5


@pytest.fixture(scope="module")
def reference(setup, tmp_path_factory) -> dict[str, torch.Tensor]:
    """The uninterrupted 2-rank job's final weights: what each resized resume must end on."""
    _, config = setup
    pods = [tmp_path_factory.mktemp("ref") / f"pod-{r}" for r in range(2)]
    assert wait_pods(start_pods(config, pods, free_port())) == [0, 0], last_log(pods[0])[-3000:]
    return _weights(pods[0])


@pytest.mark.slow
@pytest.mark.parametrize("resume_on", [1, 4], ids=["2-to-1", "2-to-4"])
def test_a_2_rank_checkpoint_resumes_on_another_world_size(setup, reference, tmp_path, resume_on):
    _, config = setup
    pods = [tmp_path / "run" / f"pod-{r}" for r in range(2)]
    procs = start_pods(config, pods, free_port())
    ckpts = pods[0] / "out" / "checkpoints"
    deadline = time.time() + 240
    while not (ckpts / "step-00000006").is_dir():
        assert time.time() < deadline and all(p.poll() is None for p in procs), last_log(pods[0])[-2000:]
        time.sleep(0.05)
    for p in procs:
        p.send_signal(signal.SIGKILL)
    wait_pods(procs)
    # the job comes back on another number of processes; rank 0 keeps its pod (and its checkpoints)
    again = [pods[0]] + [tmp_path / "run" / f"new-{r}" for r in range(1, resume_on)]
    assert wait_pods(start_pods(config, again, free_port())) == [0] * resume_on, last_log(again[0])[-3000:]
    log = last_log(again[0])
    assert f"world size 2 -> {resume_on} at step " in log and "the same batches" in log
    assert "global batch 8" in log
    diff = _close(_weights(again[0]), reference)
    assert diff < 1e-5, diff
    metrics = json.loads((again[0] / "out" / "metrics.json").read_text())  # this run's, and the job's history
    assert metrics["world_size"] == resume_on and [h["world_size"] for h in metrics["history"]] == [2, resume_on]
    card = (again[0] / "out" / "final-model" / "README.md").read_text()
    assert f"| world size | {resume_on} process(es) on CPU, fp32 (world size 2 -> {resume_on} at step " in card


def _run_state(tmp_path: Path, world_size: int, device: str, precision: str, step: int = 0):
    """The state of a run of a linear model on ``world_size`` ranks (this process is rank 0), as build makes it."""
    from trainer.env import Layout

    cfg = parse_config(
        {
            "data": {"train": {"path": "t"}},
            "training": {"max_steps": 20, "global_batch_size": 8},
            "output_dir": str(tmp_path / "out"),
        }
    )
    return linear_state(
        cfg=cfg,
        layout=Layout(world_size=world_size),
        total_steps=20,
        step=step,
        metrics={"world_size": world_size, "device": device, "precision": precision, "global_batch": 8},
    )


@pytest.mark.slow
def test_a_resized_job_reports_this_runs_world_size_device_and_precision_and_its_history(tmp_path):
    """Issue 42: resuming a 2-rank checkpoint on 1 rank overwrote this run's world size, device and precision
    with the checkpoint's, so metrics.json and the card said 2. Driven through the trainer's own resume."""
    from trainer.run import resume
    from trainer.storage.card import render
    from trainer.train import _resume

    def checkpoint(t) -> None:
        resume.save(t.ckpt_dir, resume.capture(t), keep_last=1)

    checkpoint(_run_state(tmp_path, 2, "NVIDIA A100", "bf16", step=6))
    same = _run_state(tmp_path, 2, "NVIDIA A100", "bf16")
    _resume(same)  # the same shape: nothing to tell
    assert same.step == 6 and "history" not in same.metrics and same.metrics["world_size"] == 2
    one = _run_state(tmp_path, 1, "CPU", "fp32")
    _resume(one)
    assert (one.step, one.metrics["world_size"], one.metrics["device"], one.metrics["precision"]) == (
        6,
        1,
        "CPU",
        "fp32",
    )
    assert one.metrics["history"] == [
        {"step": 0, "world_size": 2, "device": "NVIDIA A100", "precision": "bf16"},
        {"step": 6, "world_size": 1, "device": "CPU", "precision": "fp32"},
    ]
    one.step = 9
    checkpoint(one)
    four = _run_state(tmp_path, 4, "CPU", "fp32")
    _resume(four)
    assert four.metrics["world_size"] == 4 and [h["step"] for h in four.metrics["history"]] == [0, 6, 9]
    card = render(four.cfg, four.metrics)
    assert (
        "| world size | 4 process(es) on CPU, fp32 (world size 2 -> 1, device NVIDIA A100 -> CPU, precision "
        "bf16 -> fp32 at step 6; world size 1 -> 4 at step 9) |"
    ) in card


def _elastic_job(tmp_path: Path, model: Path, steps: int) -> tuple[subprocess.Popen, Path]:
    """``colbert-k8s local --elastic 1:3`` on three replicas (dropout on), a checkpoint every 3 steps."""
    from tests.helpers import ROOT
    from tests.helpers.local import local_command, local_workdir

    over = {"training.global_batch_size": 12, "training.max_steps": steps, "checkpoint.every_steps": 3}
    local_workdir(tmp_path, model, 120, over)
    flags = ("--elastic", "1:3", "--pvc-size", "1Gi", "-v")  # -v: every rank's lines, counted below
    cmd = local_command(tmp_path / "train.yaml", "tiny", tmp_path, *flags)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, tmp_path / "output" / "checkpoints"


def _after_a_checkpoint(proc: subprocess.Popen, ckpts: Path, act) -> str:
    """Once step 6 is checkpointed, ``act(replica worker-2's first process)``; the job's output. A job that
    hangs or fails does not outlive the test (torchrun's workers run in sessions of their own)."""
    import psutil

    from trainer.run.checkpoint import list_checkpoints

    job = psutil.Process(proc.pid)
    try:
        deadline = time.time() + 300
        while not any(s >= 6 for s, _ in list_checkpoints(ckpts)):
            assert proc.poll() is None and time.time() < deadline, "finished (or hung) before a node could be lost"
            time.sleep(0.05)
        # worker-2: not worker-0, whose agent hosts the rendezvous store (on a cluster as here)
        act(next(p for p in job.children() if p.environ().get("HOSTNAME") == "tiny-worker-2"))
        return proc.communicate(timeout=480)[0]
    finally:
        for p in [*job.children(recursive=True), job] if proc.poll() is None else []:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


@pytest.mark.slow
def test_an_elastic_job_that_loses_a_node_for_good_finishes_on_the_survivors(tmp_path, tiny_model):
    """After a checkpoint one replica dies for good: every process of it is SIGKILLed at once, as when its
    node goes, and local does not start it again. The survivors' agents re-form the group on two nodes, the
    trainer resumes at world size 2 from the newest checkpoint and finishes; no human in between."""
    from trainer.run.checkpoint import list_checkpoints, load_checkpoint

    steps = 60
    proc, ckpts = _elastic_job(tmp_path, tiny_model, steps)

    def node_dies(first):
        for p in [first, *first.children(recursive=True)]:
            p.kill()

    out = _after_a_checkpoint(proc, ckpts, node_dies)
    assert proc.returncode == 0, out[-4000:]
    assert "replica worker-2 was killed (SIGKILL): a node gone for good, not started again; 2 of 3" in out
    went_on = re.search(r"world size 3 -> 2 at step (\d+)", out)
    assert went_on, out[-4000:]
    step = int(went_on.group(1))
    assert step >= 6 and step % 3 == 0
    assert f"resumed from output/checkpoints/step-{step:08d} at step {step}/{steps}" in out
    assert "world size 2 x per-device batch 6 x accumulation 1 = global batch 12" in out
    assert json.loads((tmp_path / "output" / "metrics.json").read_text())["steps"] == steps
    last_step, last = list_checkpoints(ckpts)[-1]
    assert last_step > step and load_checkpoint(last)["world_size"] == 2


@pytest.mark.slow
def test_an_elastic_replica_that_stops_is_started_again_and_the_group_regrows(tmp_path, tiny_model):
    """SIGTERM to one replica (an eviction): torchrun passes it on, every rank checkpoints the step it
    stopped at (the stop is agreed collectively), local starts that replica again alone, its agent rejoins,
    and the group of three resumes from that step and finishes, with its pod restart counted."""
    from trainer.run.checkpoint import list_checkpoints, load_checkpoint

    steps = 60
    proc, ckpts = _elastic_job(tmp_path, tiny_model, steps)
    out = _after_a_checkpoint(proc, ckpts, lambda first: first.send_signal(signal.SIGTERM))
    assert proc.returncode == 0, out[-4000:]
    assert "local: replica worker-2 ended with exit code 143; restarting it (1/3)" in out
    stopped = {int(s) for s in re.findall(r"stopped by SIGTERM after step (\d+)", out)}
    assert len(stopped) == 1, out[-4000:]
    step = stopped.pop()
    assert out.count(f"resumed from output/checkpoints/step-{step:08d} at step {step}/{steps}") == 3  # three ranks
    assert f"job tiny succeeded: {steps} steps" in out and "1 restart(s)" in out
    last_step, last = list_checkpoints(ckpts)[-1]
    assert last_step > step and load_checkpoint(last)["world_size"] == 3


def test_elastic_workers_get_a_store_of_their_round(monkeypatch):
    """torchrun's agents each count their own restarts and prefix the shared store with that count: after a
    failure on one node and a membership change on another, the workers wait under different prefixes
    forever (pytorch/pytorch#135712, a hang seen in the test above). The launcher turns the sharing off."""
    import trainer.cli as trainer_cli
    from trainer.env import resolve

    seen = {}

    class Child:
        def __init__(self, cmd, env):
            seen.update(cmd=cmd, env=env)

        def wait(self):
            return 0

    monkeypatch.setattr(trainer_cli.subprocess, "Popen", Child)
    elastic = {"PET_RDZV_ENDPOINT": "job-worker-0:23456", "PET_NNODES": "1:3", "PET_NPROC_PER_NODE": "1"}
    assert trainer_cli.launch_torchrun(resolve(elastic, 0), ["--config", "c.yaml"]) == 0
    assert seen["env"]["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert "--rdzv_endpoint=job-worker-0:23456" in seen["cmd"]
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    trainer_cli.launch_torchrun(resolve({}, 4), ["--config", "c.yaml"])  # not elastic: torch's default
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in seen["env"]
