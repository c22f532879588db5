"""W=2 ranks x b per device must give the gradient of 1 process x 2b examples (issue: PyLate's W-fold error)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT, write_triplets

HELPER = str(ROOT / "tests" / "helpers" / "grad_step.py")


def _run(args: list[str], nproc: int, env_port: int) -> None:
    if nproc == 1:
        cmd = [sys.executable, HELPER, *args]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={nproc}",
            f"--master_port={env_port}",
            HELPER,
            *args,
        ]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["contrastive", "cached-contrastive"])
def test_two_ranks_equal_one_process(loss, tiny_model, tmp_path, unused_tcp_port):
    data = write_triplets(tmp_path / "train.jsonl", 16)
    _run([str(tiny_model), str(data), loss, "8", str(tmp_path / "one.pt")], 1, unused_tcp_port)
    _run([str(tiny_model), str(data), loss, "4", str(tmp_path / "two.pt")], 2, unused_tcp_port)
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    rel = (one["grad"] - two["grad"]).norm() / one["grad"].norm()
    assert one["grad"].norm() > 0
    assert rel < 1e-5, f"relative gradient error {rel:.2e}"
    assert abs(one["loss"] - two["loss"]) < 1e-5 * abs(one["loss"])  # logged loss is the global mean


@pytest.mark.slow
def test_cached_equals_plain(tiny_model, tmp_path, unused_tcp_port):
    data = write_triplets(tmp_path / "train.jsonl", 8)
    _run([str(tiny_model), str(data), "contrastive", "8", str(tmp_path / "plain.pt")], 1, unused_tcp_port)
    _run([str(tiny_model), str(data), "cached-contrastive", "8", str(tmp_path / "cached.pt")], 1, unused_tcp_port)
    plain, cached = torch.load(tmp_path / "plain.pt"), torch.load(tmp_path / "cached.pt")
    assert ((plain["grad"] - cached["grad"]).norm() / plain["grad"].norm()) < 1e-5
