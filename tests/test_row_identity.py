"""Rows are known by every row's content (issue 42, item 3). The fingerprint of mined parts and a checkpoint's
data check used the row count, the width and 64 sampled rows: a user corrected row 3's positive, the restart
logged "mined rows found" and trained on the old positive. Each test edits one row that 0.3's sample skips
(asserted: the old identity does not see the edit), and the restart must see it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers.mining import pairs_config
from trainer.config.schema import DataSource
from trainer.data import load_rows
from trainer.env import Layout
from trainer.mine import mine

N = 130  # 0.3 sampled rows 0, 2, 4, 6, 8, ... of 130: row 3 is never looked at
EDITED = 3


def _pairs(edit: bool = False) -> list[dict]:
    rows = [
        {"query": f"how to sort list {i} quickly", "positive": f"sorting list {i} with sorted and key"}
        for i in range(N)
    ]
    if edit:
        rows[EDITED]["positive"] = f"sorting list {EDITED} with sorted and a corrected key"
    return rows


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rows(path: Path, cache: Path):
    return load_rows(
        DataSource(path=str(path), columns={"query": "query", "positive": "positive", "negatives": []}),
        distillation=False,
        cache_dir=cache,
    )


def test_one_edited_row_between_the_samples_changes_the_identity_and_a_copy_does_not(tmp_path):
    before = _rows(_write(tmp_path / "a.jsonl", _pairs()), tmp_path / "cache")
    after = _rows(_write(tmp_path / "b.jsonl", _pairs(edit=True)), tmp_path / "cache")
    assert after.sampled_identity() == before.sampled_identity()  # what 0.3 compared: blind to row 3
    assert after.identity() != before.identity()
    # the same rows staged again, in another format, path and cache, chunked otherwise by their reader
    copy = tmp_path / "copy.parquet"
    pq.write_table(pa.Table.from_pylist(_pairs()), copy, row_group_size=100)
    assert _rows(copy, tmp_path / "other-cache").identity() == before.identity()


def test_a_restart_after_one_positive_is_edited_mines_again(tmp_path, caplog):
    """Mined rows made from the old positive were trusted ("mined rows found"); now the parts are mined again
    and equal what mining the edited file from scratch writes."""
    cfg = pairs_config(
        tmp_path, _pairs(), retriever="bm25", top_k=12, rank_range=[1, 8], max_score_ratio=1.0, negatives=2
    )
    out = tmp_path / "mined"
    mine(cfg, Layout(), out)
    _write(Path(cfg.data.train.path), _pairs(edit=True))  # corrected in place
    with caplog.at_level("INFO", logger="trainer"):
        resumed = pq.read_table(mine(cfg, Layout(), out))
    said = [r.getMessage() for r in caplog.records]
    assert not any("mined rows found" in m for m in said)
    assert any("mined from other inputs (data.train rows: sha256:" in m for m in said), said
    assert "with sorted and a corrected key" in resumed.column("positive").to_pylist()[EDITED]
    fresh = pq.read_table(mine(cfg, Layout(), tmp_path / "fresh"))
    assert resumed.equals(fresh)


def test_a_checkpoint_is_refused_after_one_positive_is_edited_and_one_of_0_3_is_checked_as_it_was(tmp_path):
    from tests.helpers.states import tiny_state
    from trainer.run import resume
    from trainer.run.checkpoint import CheckpointError

    data = _write(tmp_path / "t.jsonl", _pairs())
    rows = _rows(data, tmp_path / "cache")
    t = tiny_state(tmp_path)
    t.data_identity, t.data_sampled = rows.identity(), rows.sampled_identity()
    resume.save(t.ckpt_dir, resume.capture(t), keep_last=1)
    assert resume.load_for_job(t.ckpt_dir, t.cfg, 1, rows.identity(), rows.sampled_identity())  # the same rows
    edited = _rows(_write(data, _pairs(edit=True)), tmp_path / "cache")
    with pytest.raises(CheckpointError, match="was trained on other rows than data.train holds now") as e:
        resume.load_for_job(t.ckpt_dir, t.cfg, 1, edited.identity(), edited.sampled_identity())
    assert "\n" not in str(e.value)
    # a checkpoint 0.3 wrote holds its sampled identity: it resumes on its rows, and a big change is refused
    old = tiny_state(tmp_path / "old")
    old.data_identity = rows.sampled_identity()
    resume.save(old.ckpt_dir, resume.capture(old), keep_last=1)
    assert resume.load_for_job(old.ckpt_dir, old.cfg, 1, rows.identity(), rows.sampled_identity())
    fewer = _rows(_write(tmp_path / "fewer.jsonl", _pairs()[:100]), tmp_path / "cache")
    with pytest.raises(CheckpointError, match="was trained on other rows"):
        resume.load_for_job(old.ckpt_dir, old.cfg, 1, fewer.identity(), fewer.sampled_identity())
