"""A flipped bit in a manifest itself (issue 42, item 6). Of 1,304 single-bit flips of a checkpoint's
manifest, 46 refused the whole job (a "format" other than 1: exit 2, the good checkpoint before it never
tried) and 66 crashed with a KeyError ("rize", "rha256"); 132 of 2,472 flips of ``done.json`` crashed at every
start. Every bit of a real manifest and of a real ``done.json`` (written by the production code) is flipped
here: a checkpoint falls back to the one before, a marker has its phase redone, and nothing crashes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers.outputs import fake_output, phases_config
from trainer.run.checkpoint import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    latest_checkpoint,
    save_checkpoint,
    write_manifest,
)


def _flips(path: Path):
    """Each single-bit flip of ``path``, written in place (one open file, the same length: fast), as bytes."""
    data = path.read_bytes()
    fd = os.open(path, os.O_WRONLY)
    try:
        for i in range(len(data)):
            for bit in range(8):
                flipped = bytearray(data)
                flipped[i] ^= 1 << bit
                os.pwrite(fd, flipped, 0)
                yield bytes(flipped)
    finally:
        os.close(fd)


def _two_checkpoints(root: Path) -> Path:
    for step in (1, 2):
        save_checkpoint(root, step, {"format": CHECKPOINT_FORMAT, "step": step}, keep_last=2)
    return root / "step-00000002" / "manifest.json"


def test_every_flipped_bit_of_a_checkpoint_manifest_falls_back_or_loads_never_refuses_or_crashes(tmp_path):
    template = tmp_path / "template"
    manifest = _two_checkpoints(template)
    good = manifest.read_bytes()
    outcomes = {1: 0, 2: 0}
    newest, aside = template / "step-00000002", template / "corrupt-step-00000002"
    for flipped in _flips(manifest):
        path, state = latest_checkpoint(template)  # no CheckpointError (a refusal), no KeyError
        outcomes[state["step"]] += 1
        if state["step"] == 1:  # the damaged one is set aside, kept
            assert (aside / "manifest.json").read_bytes() == flipped and not newest.exists()
            aside.rename(newest)
    assert outcomes[1] > 0.9 * 8 * len(good), outcomes  # the rest: a flip JSON reads as the same manifest


def test_a_checkpoint_of_another_format_in_its_state_too_is_still_refused(tmp_path):
    """A newer trainer's checkpoint (its state.pt says so too) is refused in one line, not set aside."""
    root = tmp_path / "ckpt"
    save_checkpoint(root, 1, {"format": CHECKPOINT_FORMAT + 1, "step": 1}, keep_last=1)
    path = root / "step-00000001"
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps({**manifest, "format": CHECKPOINT_FORMAT + 1}))
    with pytest.raises(CheckpointError, match=f"format {CHECKPOINT_FORMAT + 1}, this trainer reads format"):
        latest_checkpoint(root)
    assert path.is_dir()


def test_every_flipped_bit_of_done_json_redoes_the_training_phase_never_crashes(tmp_path):
    from trainer import phases

    out = tmp_path / "out"
    fake_output(out, index=True)
    cfg = phases_config(out, index=True)
    phases.mark_done(cfg)
    seen = set()
    for _ in _flips(out / phases.DONE):
        phase, why = phases.redo_from(cfg)  # no KeyError
        assert phase in (None, "train") and "\n" not in why, why  # None: a flip JSON reads as the same marker
        seen.add(why.split(": ", 1)[-1][:12])
    assert len(seen) > 5, seen  # the flips reach several of the reader's checks


def test_a_manifest_naming_a_file_outside_its_directory_is_damaged_not_read(tmp_path):
    from trainer.run.checkpoint import verify

    (tmp_path / "secret").write_text("x")
    inside = tmp_path / "d"
    inside.mkdir()
    (inside / "a").write_text("x")
    write_manifest(inside)
    manifest = json.loads((inside / "manifest.json").read_text())
    for name in ("../secret", str(tmp_path / "secret")):
        (inside / "manifest.json").write_text(json.dumps({**manifest, "files": {name: manifest["files"]["a"]}}))
        assert "not a file inside the directory" in verify(inside, required=True)
