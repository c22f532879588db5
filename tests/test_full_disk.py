"""A full disk is one line and an exit within seconds, never a hang (issue 35): ENOSPC during a checkpoint
write gave two chained tracebacks and a process that waited on its own DataLoader worker for days; its
``.tmp-step-N`` stayed, so the restart hit ENOSPC again after the space was freed."""

from __future__ import annotations

import errno
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from operator_cli.lines import text_lines
from operator_cli.local.output import shown as show
from tests.helpers import write_triplets
from tests.helpers.outputs import fake_output, phases_config


@pytest.fixture
def small_volume(tmp_path):
    """A 6 MiB tmpfs: room for the data and the model, not for a checkpoint (needs root, as CI has)."""
    mount = tmp_path / "volume"
    mount.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)], capture_output=True)
    if res.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()[:120]}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow
def test_a_checkpoint_on_a_full_disk_is_one_line_and_an_exit_and_resumes_once_freed(tmp_path, tiny_model, small_volume):
    data = write_triplets(tmp_path / "t.jsonl", 32)
    cfg = {
        "model": {"name_or_path": str(tiny_model), "query_length": 16, "document_length": 32},
        "data": {"train": {"path": str(data)}, "num_workers": 1, "cache_dir": str(tmp_path / "cache")},
        "training": {"per_device_batch_size": 4, "max_steps": 4},
        "checkpoint": {"every_steps": 2},
        "evaluation": {"after_training": False},
        "output_dir": str(small_volume / "out"),
    }
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(cfg))
    start = time.time()
    res = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", str(config)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    took = time.time() - start
    errors = [line for line in res.stderr.splitlines() if "error:" in line]
    assert res.returncode == 2 and len(errors) == 1, res.stderr[-3000:]
    assert "has no space left" in errors[0] and "free" in errors[0] and "Traceback" not in res.stderr
    # on a line of its own: written onto the training bar's open line, `local` dropped it with the bar
    assert errors[0].startswith("colbert-train: error: "), errors[0][:200]
    shown = [t for line in text_lines([res.stderr.encode()], carriage_return_ends_line=True) for t in show(line)]
    assert [t for t in shown if "error:" in t] == errors, shown[-5:]
    assert took < 120, took  # the process ended: no wait on its own DataLoader worker
    assert not list((small_volume / "out" / "checkpoints").glob(".tmp-*"))  # the failed write is gone
    # space is freed (the volume grows): the same command resumes and finishes
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_volume)], check=True)
    res = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", str(config)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert (small_volume / "out" / "final-model").is_dir()


def test_temporaries_a_killed_run_left_are_removed_at_start(tmp_path):
    """.tmp-step-*, .tmp-final-model-* and .tmp-index-* stayed for good after a kill, and a 5.8 MiB one made
    the restart hit ENOSPC at the same step again."""
    from trainer.run.checkpoint import remove_stale_temporaries

    out = tmp_path / "out"
    for d in ("checkpoints/.tmp-step-00000004-123", ".tmp-final-model-99", ".tmp-index-7"):
        (out / d).mkdir(parents=True)
        (out / d / "x").write_bytes(b"0" * 100)
    (out / "checkpoints" / "step-00000002").mkdir()  # a complete checkpoint stays
    assert len(remove_stale_temporaries(out)) == 3
    assert sorted(p.name for p in out.rglob("*") if p.is_dir()) == ["checkpoints", "step-00000002"]


def _enospc() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device")


def _checkpoint(tmp_path: Path, monkeypatch) -> Path:
    """torch.save's writer wraps the OSError in a RuntimeError, halfway into state.pt."""
    import trainer.run.checkpoint as checkpoint

    def save(state, f):
        f.write(b"0" * 1000)
        raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0") from _enospc()

    monkeypatch.setattr(checkpoint.torch, "save", save)
    checkpoint.save_checkpoint(tmp_path / "checkpoints", 4, {"step": 4}, keep_last=2)
    return tmp_path / "checkpoints"


def _marker(tmp_path: Path, monkeypatch) -> Path:
    """done.json, half-written when the volume fills."""
    import trainer.phases as phases

    def write_manifest(directory, files, name):
        (directory / name).write_text('{"format": 1, "fi')
        raise _enospc()

    fake_output(tmp_path, index=False)
    monkeypatch.setattr(phases, "write_manifest", write_manifest)
    phases.mark_done(phases_config(tmp_path, index=False))
    return tmp_path


def _rows(tmp_path: Path, monkeypatch) -> Path:
    """The Arrow copy of data.train in data.cache_dir: pyarrow says ENOSPC in its own error's text."""
    import pyarrow as pa

    import trainer.data.rows as rows
    from trainer.config.schema import DataSource

    def convert(src, path, distillation, out, shown):
        out.write_bytes(b"0" * 1000)
        raise pa.ArrowIOError("Error writing bytes to file. Detail: [errno 28] No space left on device")

    monkeypatch.setattr(rows, "_convert", convert)
    rows.load_rows(DataSource(path=str(write_triplets(tmp_path / "t.jsonl", 4))), False, tmp_path / "cache")
    return tmp_path / "cache"


@pytest.mark.parametrize(
    ("write", "named"),
    [(_checkpoint, r"/checkpoints/\.tmp-step-00000004-\d+"), (_marker, "/done.json"), (_rows, "/rows.arrow")],
    ids=["checkpoint", "done-marker", "arrow-rows"],
)
def test_every_write_names_a_full_disk_in_one_line_and_leaves_no_temporary(tmp_path, monkeypatch, write, named):
    """Each of the trainer's writes goes through trainer/atomic.py's whole_or_absent: whatever error the writer
    wraps ENOSPC in, the job ends with DiskFull's line naming the path, and nothing half-written stays."""
    from trainer.errors import DiskFull

    with pytest.raises(DiskFull) as e:
        write(tmp_path, monkeypatch)
    line = str(e.value)
    assert re.search(f"{named}: the volume has no space left \\(No space left on device", line), line
    assert "free space or grow the volume" in line and "\n" not in line
    half = [p for p in tmp_path.rglob("*") if ".tmp" in p.name or p.name in ("state.pt", "done.json", "rows.arrow")]
    assert half == [], half
