"""Non-finite values are stopped where they start (issue 35): a score that overflows float32 is refused
with its row, and a NaN gradient stops the job before the update (or is skipped, when allowed), so no
weight, checkpoint or final model ever holds it."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

from trainer.config import DataSource
from trainer.data import DataError, load_rows
from trainer.errors import NonFinite
from trainer.step import TrainState, apply_update


def test_a_score_finite_in_float64_but_infinite_in_float32_is_refused_with_its_row(tmp_path):
    """1e300 passed the finite check (float64) and became inf in the float32 Arrow copy."""
    path = tmp_path / "d.jsonl"
    rows = [{"query": "q", "documents": ["a", "b"], "scores": [1.0, 0.5]},
            {"query": "q2", "documents": ["a", "b"], "scores": [1e300, 0.5]}]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as e:
        load_rows(DataSource(path=str(path)), distillation=True, cache_dir=tmp_path / "cache")
    assert "row 2: column 'scores' holds 1e+300, beyond float32" in str(e.value) and "\n" not in str(e.value)


def _state(skip: int = 0) -> TrainState:
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    return TrainState(
        model=model, forward=model, params=list(model.parameters()), optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
        scaler=torch.amp.GradScaler("cpu", enabled=False), autocast=contextlib.nullcontext, data=None,
        loss_fn=None, total_steps=10, max_grad_norm=1.0, skip_nonfinite=skip,
    )  # fmt: skip


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

    def boom(cfg, plan):
        raise NonFinite("step 7: the gradient is not finite (norm nan)")

    import trainer.rounds

    monkeypatch.setattr(trainer.rounds, "run", boom)
    (tmp_path / "t.jsonl").write_text(json.dumps({"query": "q", "positive": "p", "negative": "n"}) + "\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"data: {{train: {{path: {tmp_path}/t.jsonl}}}}\ntraining: {{max_steps: 1}}\n"
                      f"output_dir: {tmp_path}/out\n")  # fmt: skip
    monkeypatch.chdir(tmp_path)
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "PET_NNODES", "PET_NPROC_PER_NODE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    code = cli.main(["--config", str(config)])
    err = capsys.readouterr().err
    assert code == 2 and "step 7: the gradient is not finite" in err and "Traceback" not in err


def test_non_finite_weights_are_named_as_such_never_as_ranks_that_differ():
    """NaN != NaN: the cross-rank checksum said "weights differ between rank 0 and rank 0" (retryable, 129),
    and the job burnt its restarts on a checkpoint it could never write."""
    from trainer.resume import check_same_weights

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    check_same_weights(model, "at step 3")  # finite: passes
    with torch.no_grad():
        model[1].weight[0, 0] = float("nan")
    with pytest.raises(NonFinite, match=r"weights are not finite at step 3 \(first: 1.weight\)"):
        check_same_weights(model, "at step 3")
