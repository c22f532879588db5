"""What `local` shows of its replicas' output (issue 43): one line per event, rank 0's once, other ranks'
warnings and errors, progress as one readable line, no progress bar glued to a log line."""

from __future__ import annotations

import json

import pytest

from operator_cli.local.output import progress_text, shown

PROGRESS = {"phase": "mining round 1/2: encode corpus 3/6", "percent": 17, "eta_seconds": 2040, "step": None}

CASES = [
    ("rank-0-info", "[rank 0] 12:00:00 INFO scale: world size 2", ["[rank 0] 12:00:00 INFO scale: world size 2"]),
    ("rank-1-info-once-is-enough", "[rank 1] 12:00:00 INFO scale: world size 2", []),
    ("rank-1-warning", "[rank 1] 12:00:00 WARNING peer slow", ["[rank 1] 12:00:00 WARNING peer slow"]),
    (
        "rank-1-error",
        "[rank 1] 12:00:00 ERROR column 'positive' is missing",
        ["[rank 1] 12:00:00 ERROR column 'positive' is missing"],
    ),
    (
        "progress-json",
        f"[rank 0] 12:00:01 INFO progress {json.dumps(PROGRESS)}",
        ["[rank 0] 12:00:01 INFO mining round 1/2: encode corpus 3/6 · 17% · ETA 34 min"],
    ),
    (
        "bar-glued-to-a-log-line",
        "train:  25%|██▌       | 1/4 [00:26<01:20, 26.87s/it][rank 0] 12:44:07 INFO step 4/4",
        ["[rank 0] 12:44:07 INFO step 4/4"],
    ),
    ("bar-alone", "Loading weights: 100%|██████████| 103/103 [00:00<00:00, 7850.93it/s]", []),
    ("traceback-passes", "Traceback (most recent call last):", ["Traceback (most recent call last):"]),
    (
        "torchrun-line-passes",
        "W1202 12:00:00.000 torch/distributed/run.py:8] OMP_NUM_THREADS set",
        ["W1202 12:00:00.000 torch/distributed/run.py:8] OMP_NUM_THREADS set"],
    ),
    ("unreadable-progress-kept", "[rank 0] 12:00:01 INFO progress {oops", ["[rank 0] 12:00:01 INFO progress {oops"]),
]


@pytest.mark.parametrize("name,line,expected", CASES, ids=[c[0] for c in CASES])
def test_shown(name, line, expected):
    assert shown(line) == expected


def test_the_trainers_own_progress_record_reads_as_one_line():
    """A record as trainer/reporting/progress.py writes it during training (the same keys, all of them)."""
    record = {
        "best": {"metric": "ndcg@10", "step": 4, "value": 0.6336615},
        "eta_seconds": 95,
        "eval_ndcg@10": 0.6336615,
        "loss": 2.1854169,
        "lr": 0.0,
        "percent": 99,
        "phase": "train step 4/4",
        "samples_per_second": 1.3866,
        "step": 4,
        "total": 4,
    }
    assert progress_text(record) == (
        "train step 4/4 · 99% · ETA 2 min · loss 2.1854 · 1.4 samples/s · best ndcg@10 0.6337 at step 4"
    )


def test_the_summary_names_the_model_the_index_and_the_export(tmp_path):
    """`local`'s last lines: where the model and the index are on this machine (metrics.json names them
    relative to the job's volume), and the destination the export went to."""
    from operator_cli.local.run import _outputs

    out = tmp_path / "output"
    out.mkdir()
    (out / "export.json").write_text(json.dumps({"destination": "s3://models/run/", "files": 12, "bytes": 3 << 20}))
    metrics = {"model_dir": "output/final-model", "index": {"path": "output/index", "ndcg@10": 0.7}}
    assert _outputs(metrics, out, tmp_path, exported=True) == [
        f"model: {tmp_path / 'output' / 'final-model'}",
        f"index: {tmp_path / 'output' / 'index'}",
        "export: s3://models/run/ (12 files, 3.0 MiB)",
    ]
    assert _outputs(metrics, out, tmp_path, exported=False)[-1].startswith("index: ")  # an old export.json: not ours
