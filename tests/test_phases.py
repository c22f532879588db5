"""Every phase whole or absent (issue 35): the final model and the index carry the checkpoints' manifest, a
restart redoes a phase that does not verify, and the job is marked done (and exits 0) only once every phase
the config asks for is whole. A SIGKILL during the PLAID index build of a mining job, then a restart, said
"job succeeded" with no index and no index entry in metrics.json: the round's metrics.json alone meant done."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import write_triplets
from tests.helpers.outputs import fake_output, phases_config
from tests.helpers.pods import run_one_pod


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "index", "phase", "why"),
    [
        (lambda out: None, True, "done", "done.json is missing"),
        (lambda out: _flip(out / "final-model" / "model.safetensors"), True, "train", "does not match its sha256"),
        (lambda out: (out / "final-model" / "manifest.json").unlink(), False, "train", "has no manifest.json"),
        (lambda out: (out / "index" / "manifest.json").unlink(), True, "index", "has no manifest.json"),
        (lambda out: _flip(out / "index" / "colbert" / "ivf.pt"), True, "index", "does not match its sha256"),
        (lambda out: (out / "metrics.json").write_text('{"steps": 2}'), True, "index", "has no index entry"),
        (lambda out: (out / "metrics.json").write_text("{"), False, "train", "metrics.json is unreadable"),
    ],
    ids=[
        "marker-missing",
        "model-bit-flipped",
        "model-unmanifested",
        "index-unmanifested",
        "index-bit-flipped",
        "metrics-without-index",
        "metrics-truncated",
    ],
)
def test_a_phase_that_does_not_verify_is_redone_from_where_it_broke(tmp_path, damage, index, phase, why):
    from trainer import phases

    out = tmp_path / "out"
    fake_output(out, index)
    damage(out)
    found, line = phases.redo_from(phases_config(out, index))
    assert found == phase and why in line and "\n" not in line, line


def test_done_is_marked_only_when_every_phase_verifies_and_vouches_for_nothing_rewritten(tmp_path):
    from trainer import phases
    from trainer.errors import PhaseNotWhole

    out = tmp_path / "out"
    fake_output(out, index=True)
    cfg = phases_config(out, index=True)
    phases.mark_done(cfg)
    assert phases.redo_from(cfg) == (None, "")
    (out / "metrics.json").write_text(json.dumps({"steps": 3, "index": {}}))  # rewritten after the marker
    assert phases.redo_from(cfg)[0] == "train"
    (out / "index" / "manifest.json").unlink()
    with pytest.raises(PhaseNotWhole, match="the index .* is not whole: it has no manifest.json"):
        phases.mark_done(cfg)
    phases.started(cfg)
    assert not (out / phases.DONE).exists()


# ---- a full disk anywhere the job writes ------------------------------------------------------------------


@pytest.fixture
def tiny_volume(tmp_path):
    """A 1 MiB tmpfs (needs root, as CI has): a real ENOSPC from the kernel."""
    mount = tmp_path / "volume"
    mount.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if res.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()[:120]}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_metrics_json_and_a_mined_part_on_a_full_disk_are_one_line_and_leave_nothing(tiny_volume):
    """write_text (metrics.json, mining.json, fingerprint.json) and replacing (mined parts, train.parquet)
    raised a bare OSError, which the CLI named as '.' (a write error carries no file name)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trainer.atomic import replacing, write_text
    from trainer.errors import DiskFull

    text = "x" * (2 << 20)
    with pytest.raises(DiskFull) as e:
        write_text(tiny_volume / "metrics.json", text)
    line = str(e.value)
    assert line.startswith(f"{tiny_volume / 'metrics.json'}: the volume has no space left")
    assert f"about {len(text):,} bytes needed" in line and " free" in line and "\n" not in line
    table = pa.table({"query": [os.urandom(64).hex() for _ in range(20000)]})
    with pytest.raises(DiskFull, match="part-00000.parquet: the volume has no space left"):
        with replacing(tiny_volume / "part-00000.parquet", table.nbytes) as tmp:
            pq.write_table(table, tmp)
    assert list(tiny_volume.iterdir()) == []  # no temporary stays


def test_the_final_model_on_a_full_disk_is_one_line_and_leaves_nothing(tiny_volume, tiny_model):
    """safetensors raises its own SafetensorError (not an OSError) on ENOSPC: a traceback, and the
    half-written .tmp-final-model-* stayed."""
    from pylate import models

    from trainer.errors import DiskFull
    from trainer.train import _save_model

    model = models.ColBERT(str(tiny_model), device="cpu")
    with pytest.raises(DiskFull, match=r"\.tmp-final-model-\d+: the volume has no space left"):
        _save_model(model, tiny_volume / "out", "final-model")
    assert list((tiny_volume / "out").iterdir()) == []


def _beir(root: Path, data: Path, n: int = 24) -> Path:
    from trainer.quickstart_data import write_beir

    rows = [json.loads(line) for line in data.read_text().splitlines()][:n]
    write_beir(
        root,
        [(f"d{i}", r["positive"]) for i, r in enumerate(rows)],
        [(f"d{i}", r["query"]) for i, r in enumerate(rows)],
    )
    return root


def test_a_full_disk_during_the_index_build_is_one_line_and_leaves_no_temporary(tmp_path, tiny_model, monkeypatch):
    from pylate import indexes

    from trainer.errors import DiskFull
    from trainer.index import build_and_evaluate

    beir = _beir(tmp_path / "beir", write_triplets(tmp_path / "t.jsonl", 24))
    cfg = phases_config(tmp_path / "out", index=True, beir=str(beir))

    def full(self, *args, **kwargs):
        Path(self._index.index_path, "centroids.npy").write_bytes(b"0" * 100)  # half an index
        raise RuntimeError("write failed") from OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(indexes.PLAID, "add_documents", full)
    with pytest.raises(DiskFull, match=r"\.tmp-index-\d+: the volume has no space left .* free"):
        build_and_evaluate(str(tiny_model), cfg)
    assert list((tmp_path / "out").glob(".tmp-index-*")) == [] and not (tmp_path / "out" / "index").exists()


# ---- a SIGKILL during the index build of a mining job, then a restart ---------------------------------------

_KILLED_IN_INDEX = """
import os, signal, sys
from pylate import indexes
def killed(self, *a, **k):  # the kernel's SIGKILL, half-way into the build
    open(os.path.join(self._index.index_path, "centroids.npy"), "wb").write(b"0" * 100)
    os.kill(os.getpid(), signal.SIGKILL)
indexes.PLAID.add_documents = killed
from trainer.cli import main
sys.exit(main())
"""


def _mining_job(tmp: Path, model: Path, data: Path, beir: Path, name: str) -> Path:
    cfg = {
        "model": {"name_or_path": str(model), "query_length": 16, "document_length": 48},
        "data": {"train": {"path": str(data)}, "cache_dir": str(tmp / "cache"), "eval_beir": str(beir)},
        "training": {"per_device_batch_size": 4, "max_steps": 2, "seed": 5},
        "checkpoint": {"every_steps": 1},
        "evaluation": {"after_training": False, "before_training": False},
        "tracking": {"report_to": [], "run_name": "job"},  # the card names the run: the same in both output dirs
        "mine": {
            "retriever": "bm25",
            "top_k": 20,
            "rank_range": [2, 12],
            "negatives": 2,
            "max_score_ratio": 1.0,
            "query_chunk": 16,
        },
        "index": {},
        "output_dir": str(tmp / name),
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _untimed(model_dir: Path) -> dict[str, bytes]:
    """A final model's files, less the card's training time and the card's entry in manifest.json."""
    files = {k: re.sub(rb"\| training time \| \d+ s \|", b"", v) for k, v in _files(model_dir).items()}
    manifest = json.loads(files["manifest.json"])
    manifest["files"].pop("README.md")
    return {**files, "manifest.json": json.dumps(manifest, sort_keys=True).encode()}


@pytest.mark.slow
def test_a_kill_during_the_index_build_then_a_restart_ends_with_the_uninterrupted_index(tmp_path, tiny_model):
    data = write_triplets(tmp_path / "t.jsonl", 48)
    beir = _beir(tmp_path / "beir", data)
    reference = run_one_pod(_mining_job(tmp_path, tiny_model, data, beir, "whole"))
    assert reference.returncode == 0, reference.stderr[-3000:]
    config = _mining_job(tmp_path, tiny_model, data, beir, "out")
    killed = run_one_pod(config, "-c", _KILLED_IN_INDEX)
    assert killed.returncode == -9, killed.stderr[-3000:]
    out = tmp_path / "out"
    assert "index" not in json.loads((out / "metrics.json").read_text()) and not (out / "done.json").exists()
    again = run_one_pod(config)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "trained before, but the index" in again.stderr and "building the index again" in again.stderr
    # the same final model, and the index an uninterrupted run built, with its entry in metrics.json
    # the same bytes, but the card's training time (two runs of the same training take different seconds) and so
    # the card's own entry in the export manifest
    assert _untimed(out / "final-model") == _untimed(tmp_path / "whole" / "final-model")
    got, want = (json.loads((d / "metrics.json").read_text())["index"] for d in (out, tmp_path / "whole"))
    for key in ("build_seconds", "chunk_seconds", "path"):  # seconds differ between two runs
        got.pop(key), want.pop(key)
    assert got == want
    # byte for byte, but for fast-plaid's merged_*.manifest.json, which record mtimes (and ours, which hashes them)
    index, whole = (_files(d / "index") for d in (out, tmp_path / "whole"))
    differ = [k for k in index if index[k] != whole.get(k) and not k.endswith("manifest.json")]
    assert set(index) == set(whole) and differ == [] and len(index) > 5
    assert not list(out.glob(".tmp-index-*"))  # the killed build's temporary is gone
    assert run_one_pod(config).stderr.count("done before") == 1  # now whole: skipped
