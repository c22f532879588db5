"""Non-finite values are stopped where they start (issue 35): a score that overflows float32 is refused
with its row, and a NaN gradient stops the job before the update (or is skipped, when allowed), so no
weight, checkpoint or final model ever holds it."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

from tests.helpers.states import linear_state
from trainer.config.schema import DataSource
from trainer.data import DataError, load_rows
from trainer.errors import NonFinite
from trainer.run.state import TrainState
from trainer.step import apply_update


def test_a_score_finite_in_float64_but_infinite_in_float32_is_refused_with_its_row(tmp_path):
    """1e300 passed the finite check (float64) and became inf in the float32 Arrow copy."""
    path = tmp_path / "d.jsonl"
    rows = [
        {"query": "q", "documents": ["a", "b"], "scores": [1.0, 0.5]},
        {"query": "q2", "documents": ["a", "b"], "scores": [1e300, 0.5]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as e:
        load_rows(DataSource(path=str(path)), distillation=True, cache_dir=tmp_path / "cache")
    assert "row 2: column 'scores' holds 1e+300, beyond float32" in str(e.value) and "\n" not in str(e.value)


def _state(skip: int = 0) -> TrainState:
    return linear_state(total_steps=10, max_grad_norm=1.0, skip_nonfinite=skip)


def _backward(t: TrainState, value: float) -> None:
    (t.model(torch.ones(1, 3)).sum() * value).backward()


def test_a_nan_gradient_stops_the_step_before_the_update_naming_it():
    t = _state()
    before = [p.detach().clone() for p in t.params]
    _backward(t, float("nan"))
    with pytest.raises(NonFinite, match="step 1: the gradient is not finite") as e:
        apply_update(t)
    assert "\n" not in str(e.value)
    assert all(torch.equal(a, b) for a, b in zip(before, t.params))  # nothing reached the weights
    assert t.step == 0 and not t.optimizer.state  # AdamW's moments never saw it either


def test_skip_nonfinite_steps_skips_that_many_then_stops():
    t = _state(skip=1)
    _backward(t, 1.0)
    apply_update(t)  # a good step updates
    after_good = [p.detach().clone() for p in t.params]
    _backward(t, float("inf"))
    apply_update(t)  # skipped: the step counts, the weights stay
    assert t.step == 2 and t.skipped_nonfinite == 1
    assert all(torch.equal(a, b) for a, b in zip(after_good, t.params))
    _backward(t, float("nan"))
    with pytest.raises(NonFinite, match="step 3"):
        apply_update(t)


def test_the_trainer_reports_a_non_finite_step_as_exit_code_2(monkeypatch, capsys, tmp_path):
    """The CLI's contract: one ``colbert-train: error:`` line and a permanent exit code, not 'weights differ'."""
    import trainer.cli as cli

    def boom(*args, **kwargs):
        raise NonFinite("step 7: the gradient is not finite (norm nan)")

    import trainer.rounds

    monkeypatch.setattr(trainer.rounds, "run", boom)
    (tmp_path / "t.jsonl").write_text(json.dumps({"query": "q", "positive": "p", "negative": "n"}) + "\n")
    config = tmp_path / "c.yaml"
    config.write_text(
        f"data: {{train: {{path: {tmp_path}/t.jsonl}}}}\ntraining: {{max_steps: 1}}\noutput_dir: {tmp_path}/out\n"
    )
    monkeypatch.chdir(tmp_path)
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "PET_NNODES", "PET_NPROC_PER_NODE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    code = cli.main(["--config", str(config)])
    err = capsys.readouterr().err
    assert code == 2 and "step 7: the gradient is not finite" in err and "Traceback" not in err


def test_non_finite_weights_are_named_as_such_never_as_ranks_that_differ():
    """NaN != NaN: the cross-rank checksum said "weights differ between rank 0 and rank 0" (retryable, 129),
    and the job burnt its restarts on a checkpoint it could never write."""
    from trainer.run.resume import check_same_weights

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    check_same_weights(model, "at step 3")  # finite: passes
    with torch.no_grad():
        model[1].weight[0, 0] = float("nan")
    with pytest.raises(NonFinite, match=r"weights are not finite at step 3 \(first: 1.weight\)"):
        check_same_weights(model, "at step 3")


class _Killed(Exception):
    """Stands for a kill of the process right before a step (its checkpoints written, nothing after)."""


class _Faults:
    """Drives the production loop with a NaN loss at the steps in ``bad`` (by step number, so a resumed run
    meets them where the uninterrupted one does) and a kill when step ``kill`` is asked for."""

    def __init__(self, bad: set[int], kill: int | None = None):
        self.bad, self.kill, self.step = bad, kill, 0

    def install(self, monkeypatch) -> None:
        import trainer.losses
        import trainer.train as train
        from trainer.data.batches import batches as real_batches

        real_loss = trainer.losses.build_loss  # not an earlier install's

        def batches(data, start, total, *rest):
            inner = real_batches(data, start, total, *rest)
            self.step = start

            def feed():
                try:
                    for batch in inner:  # accumulation 1: a batch is a step
                        self.step += 1
                        if self.step == self.kill:
                            raise _Killed(self.step)
                        yield batch
                finally:
                    inner.close()

            return feed()

        def build_loss(*args, **kwargs):
            loss = real_loss(*args, **kwargs)

            def poisoned(forward, batch):
                out = loss(forward, batch)
                if self.step in self.bad:
                    out.loss = out.loss * float("nan")
                return out

            return poisoned

        monkeypatch.setattr(train, "batches", batches)
        monkeypatch.setattr(train, "build_loss", build_loss)


@pytest.mark.slow
def test_skipped_nonfinite_steps_are_checkpointed_so_a_restart_does_not_renew_the_budget(
    tmp_path, tiny_model, monkeypatch
):
    """The count lived in the process only: a restart after one skipped step could skip N more."""
    from tests.helpers import write_triplets
    from trainer.config.load import parse_config
    from trainer.env import Layout
    from trainer.train import run

    data = write_triplets(tmp_path / "t.jsonl", 32)

    def config(name: str):
        return parse_config(
            {
                "model": {"name_or_path": str(tiny_model), "query_length": 16, "document_length": 32},
                "data": {"train": {"path": str(data)}, "num_workers": 0, "cache_dir": str(tmp_path / "cache")},
                "training": {"per_device_batch_size": 4, "max_steps": 6, "skip_nonfinite_steps": 2, "seed": 3},
                "checkpoint": {"every_steps": 2},
                "evaluation": {"after_training": False},
                "tracking": {"report_to": []},
                "output_dir": str(tmp_path / name),
            }
        )

    _Faults({2, 5}).install(monkeypatch)
    whole = run(config("whole"), Layout())
    assert whole["skipped_nonfinite_steps"] == 2 and whole["steps"] == 6
    _Faults({2, 5}, kill=5).install(monkeypatch)
    with pytest.raises(_Killed):
        run(config("out"), Layout())
    assert (tmp_path / "out" / "checkpoints" / "step-00000004").is_dir()
    _Faults({2, 5}).install(monkeypatch)
    resumed = run(config("out"), Layout())  # from step 4: one skipped before it, one at step 5
    assert resumed["skipped_nonfinite_steps"] == 2
    model = "final-model/model.safetensors"
    assert (tmp_path / "out" / model).read_bytes() == (tmp_path / "whole" / model).read_bytes()
    # and the budget holds across the restart: with 1 allowed, step 5's is one too many, resumed or not
    _Faults({2, 5}, kill=5).install(monkeypatch)
    tight = config("tight").model_copy(
        update={"training": config("tight").training.model_copy(update={"skip_nonfinite_steps": 1})}
    )
    with pytest.raises(_Killed):
        run(tight, Layout())
    _Faults({2, 5}).install(monkeypatch)
    with pytest.raises(NonFinite, match="step 5: the gradient is not finite"):
        run(tight, Layout())


def test_fp16_steps_the_scaler_skips_are_logged_counted_and_stop_the_job_below_the_scale_floor(caplog):
    """Issue 42: under GradScaler a NaN loss at every step was skipped without end, log or count: 40 of 40
    steps "done", the scale down to 6e-8, the base weights published. Driven here with a real (CPU)
    GradScaler through the production step."""
    from trainer.step import MIN_LOSS_SCALE

    t = _state()
    t.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)  # 4 halvings to 1, the 5th goes below

    def backward(value: float) -> None:
        t.scaler.scale(t.model(torch.ones(1, 3)).sum() * value).backward()

    backward(1.0)
    apply_update(t)  # a good step: applied, nothing counted
    assert t.metrics.get("scaler_skipped_steps", 0) == 0
    good = [p.detach().clone() for p in t.params]
    with caplog.at_level("WARNING", logger="trainer"):
        for n in range(1, 5):
            backward(float("nan"))
            apply_update(t)
            assert t.metrics["scaler_skipped_steps"] == n and t.step == 1 + n
            assert t.scaler.get_scale() == 2.0 ** (4 - n) >= MIN_LOSS_SCALE
    assert all(torch.equal(a, b) for a, b in zip(good, t.params))  # nothing reached the weights
    warned = [r.getMessage() for r in caplog.records if "GradScaler skipped" in r.getMessage()]
    assert len(warned) == 4 and warned[0].startswith("step 2: fp16 gradient not finite at loss scale 16")
    backward(float("nan"))
    with pytest.raises(NonFinite, match=r"step 6: the gradient is not finite even at fp16 loss scale 1 ") as e:
        apply_update(t)
    assert "\n" not in str(e.value) and "skipped 5 step(s)" in str(e.value)
    assert all(torch.equal(a, b) for a, b in zip(good, t.params))


@pytest.mark.slow
def test_fp16_skips_reach_metrics_json_survive_a_restart_and_a_nan_at_every_step_stops_the_job(
    tmp_path, tiny_model, monkeypatch
):
    """The production loop with fp16's real GradScaler (on CPU, fp32 arithmetic): the skips are in metrics.json,
    a restart from a checkpoint keeps the count, and a NaN loss at every step ends the job (exit 2's error)
    instead of publishing the base weights after a full run."""
    import trainer.train as train
    from tests.helpers import write_triplets
    from trainer.config.load import parse_config
    from trainer.env import Layout
    from trainer.train import run

    monkeypatch.setattr(train, "choose_precision", lambda requested, device: "fp16")  # fp16 needs CUDA otherwise
    monkeypatch.setattr(train, "autocast_for", lambda precision, device: contextlib.nullcontext)
    data = write_triplets(tmp_path / "t.jsonl", 32)

    def config(name: str, steps: int = 6):
        return parse_config(
            {
                "model": {"name_or_path": str(tiny_model), "query_length": 16, "document_length": 32},
                "data": {"train": {"path": str(data)}, "num_workers": 0, "cache_dir": str(tmp_path / "cache")},
                "training": {"per_device_batch_size": 4, "max_steps": steps, "seed": 3},
                "checkpoint": {"every_steps": 2},
                "evaluation": {"after_training": False},
                "tracking": {"report_to": []},
                "output_dir": str(tmp_path / name),
            }
        )

    _Faults({2, 5}).install(monkeypatch)
    whole = run(config("whole"), Layout())
    written = json.loads((tmp_path / "whole" / "metrics.json").read_text())
    assert written["scaler_skipped_steps"] == whole["scaler_skipped_steps"] == 2 and written["precision"] == "fp16"
    assert written["loss_scale"] == 2.0**14 and written["skipped_nonfinite_steps"] == 0
    _Faults({2, 5}, kill=5).install(monkeypatch)
    with pytest.raises(_Killed):
        run(config("out"), Layout())
    _Faults({2, 5}).install(monkeypatch)
    assert run(config("out"), Layout())["scaler_skipped_steps"] == 2  # one before the checkpoint at 4, one after
    _Faults(set(range(1, 41))).install(monkeypatch)
    with pytest.raises(NonFinite, match="step 17: the gradient is not finite even at fp16 loss scale 1 "):
        run(config("nan", steps=40), Layout())
    assert not (tmp_path / "nan" / "final-model").exists() and not (tmp_path / "nan" / "metrics.json").exists()
