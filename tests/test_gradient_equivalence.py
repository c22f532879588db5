"""W=2 ranks x b per device must give the gradient of 1 process x 2b examples (PyLate's W-fold error),
through the trainer's production step: ``train.build`` (DDP, the gather), ``step.accumulate_gradients``.

The model has no dropout here: two splits of one batch draw different dropout masks by design, so
only the mathematics can be compared (resume tests keep dropout on)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.helpers import ROOT, write_triplets

HELPER = str(ROOT / "tests" / "scripts" / "grad_step.py")


def _grad(model, data, loss: str, per_device: int, accumulation: int, nproc: int, port: int, out) -> dict:
    launch = (
        [sys.executable]
        if nproc == 1
        else [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={port}"]
    )
    args = [str(model), str(data), loss, str(per_device), str(accumulation), str(out)]
    res = subprocess.run([*launch, HELPER, *args], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    return torch.load(out)


def _rel(a: dict, b: dict) -> float:
    return float((a["grad"] - b["grad"]).norm() / a["grad"].norm())


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["contrastive", "cached-contrastive"])
def test_two_ranks_equal_one_process(loss, tiny_model_no_dropout, tmp_path, unused_tcp_port):
    data = write_triplets(tmp_path / "train.jsonl", 16)
    one = _grad(tiny_model_no_dropout, data, loss, 8, 1, 1, unused_tcp_port, tmp_path / "one.pt")
    two = _grad(tiny_model_no_dropout, data, loss, 4, 1, 2, unused_tcp_port, tmp_path / "two.pt")
    assert one["grad"].norm() > 0
    assert _rel(one, two) < 1e-5, f"relative gradient error {_rel(one, two):.2e}"
    assert abs(one["loss"] - two["loss"]) < 1e-5 * abs(one["loss"])  # logged loss is the global mean
    half = _grad(tiny_model_no_dropout, data, loss, 4, 1, 1, unused_tcp_port, tmp_path / "half.pt")
    assert _rel(one, half) > 1e-3  # the comparison can tell a different batch apart


@pytest.mark.slow
def test_two_ranks_with_accumulation_equal_one_process(tiny_model_no_dropout, tmp_path, unused_tcp_port):
    """Accumulation micro-steps run under DDP's no_sync; the last backward averages the sum once."""
    data = write_triplets(tmp_path / "train.jsonl", 16)
    one = _grad(tiny_model_no_dropout, data, "cached-contrastive", 4, 2, 1, unused_tcp_port, tmp_path / "one.pt")
    two = _grad(tiny_model_no_dropout, data, "cached-contrastive", 2, 2, 2, unused_tcp_port, tmp_path / "two.pt")
    assert _rel(one, two) < 1e-5, f"relative gradient error {_rel(one, two):.2e}"


@pytest.mark.slow
def test_cached_equals_plain(tiny_model_no_dropout, tmp_path, unused_tcp_port):
    data = write_triplets(tmp_path / "train.jsonl", 8)
    plain = _grad(tiny_model_no_dropout, data, "contrastive", 8, 1, 1, unused_tcp_port, tmp_path / "plain.pt")
    cached = _grad(tiny_model_no_dropout, data, "cached-contrastive", 8, 1, 1, unused_tcp_port, tmp_path / "c.pt")
    assert _rel(plain, cached) < 1e-5
