"""The benchmark scripts run (tiny configs on CPU); figures themselves live in docs/benchmarks.md."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_gpu_script_runs_on_cpu_with_a_tiny_config(tmp_path):
    out = tmp_path / "gpu.json"
    res = subprocess.run(
        [
            sys.executable,
            "bench/gpu.py",
            "--tiny",
            "--steps",
            "2",
            "--per-device-batch",
            "4",
            "--query-length",
            "16",
            "--document-length",
            "32",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["arch"]["layers"] == 2
    for side in ("ours", "reference"):
        assert result[side]["samples_per_second"] > 0 and result[side]["achieved_tflops"] > 0
        assert result[side]["mfu"] is None  # no bf16 peak is claimed for a CPU
    # 6*N*s + 12*L*h*s^2 per sequence, 4 queries of 16 tokens and 8 documents of 32 tokens
    n, layers, h = result["arch"]["non_embedding_params"], 2, 32
    seq = lambda s: 6 * n * s + 12 * layers * h * s * s  # noqa: E731
    assert result["flops_per_step"] == 4 * seq(16) + 8 * seq(32)
