"""A SIGTERM is honoured whenever it comes (trainer/run/preemption.py): at the next training step, after the
mined part in flight, or before the next phase. One that came after a round's last step (its evaluation, the
marker, the next round's mining) was logged and forgotten: a 2-round job ran to its end and exited 0, and the
kubelet would have killed it mid-phase at the end of the grace period.

The signal is sent by the trainer process to itself at a chosen point (a wrapped function of the trainer), so
where it lands does not depend on timing. Every case exits 143 and names where it stopped; the restart ends
with the uninterrupted job's bytes (CPU training and mining are deterministic)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import free_port, write_triplets
from tests.helpers.mining import mining_job
from tests.helpers.pods import pod_env, run_one_pod
from trainer.run.preemption import EXIT_PREEMPTED

# SIGTERM_AT names the point; only the process whose RANK is SIGTERM_RANK (default 0) sends it.
_SIGTERM_AT = """
import os, signal, sys
import trainer.mine, trainer.phases, trainer.train

def sigterm_at(owner, name, call, after=False):
    real, calls = getattr(owner, name), []
    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == call and not after:
            os.kill(os.getpid(), signal.SIGTERM)
        out = real(*args, **kwargs)
        if len(calls) == call and after:
            os.kill(os.getpid(), signal.SIGTERM)
        return out
    setattr(owner, name, wrapped)

if os.environ.get("RANK", "0") == os.environ.get("SIGTERM_RANK", "0"):
    at = os.environ["SIGTERM_AT"]
    if at == "evaluation":  # round 1's evaluation after training, its only one
        sigterm_at(trainer.train, "evaluate", 1)
    elif at == "between-rounds":  # round 1 was just marked done
        sigterm_at(trainer.phases, "mark_done", 1, after=True)
    elif at == "mining":  # while round 1 mines its second part of three
        sigterm_at(trainer.mine, "_part_table", 2)
from trainer.cli import main
sys.exit(main())
"""


def _job(tmp: Path, model: Path) -> Path:
    """A 2-round mining job (BM25, then the round-1 model; 3 parts a round) that evaluates after each round's
    training on a BEIR split of its own rows."""
    from trainer.quickstart_data import write_beir

    data = write_triplets(tmp / "t.jsonl", 48)
    rows = [json.loads(line) for line in data.read_text().splitlines()][:24]
    write_beir(
        tmp / "beir",
        [(f"d{i}", r["positive"]) for i, r in enumerate(rows)],
        [(f"q{i}", r["query"]) for i, r in enumerate(rows)],
    )
    config = mining_job(tmp, model, data, retriever="bm25", rounds=2)
    cfg = yaml.safe_load(config.read_text())
    cfg["data"]["eval_beir"] = str(tmp / "beir")
    cfg["evaluation"] = {"after_training": True, "before_training": False}
    cfg["tracking"] = {"report_to": []}
    config.write_text(yaml.safe_dump(cfg))
    return config


def _run(config: Path, at: str | None = None) -> subprocess.CompletedProcess:
    """The trainer as one pod would run it; ``at``: where it gets SIGTERM."""
    return run_one_pod(config, *(("-c", _SIGTERM_AT) if at else ()), env={"SIGTERM_AT": at or ""})


def _pods(config: Path, world: int, at: str | None = None, rank: int = 0) -> list[subprocess.CompletedProcess]:
    """``world`` one-process pods (tests/helpers/pods.py) sharing ``config``'s directory; the pod of ``rank``
    gets SIGTERM at ``at``."""
    port = free_port()
    launch = ["-c", _SIGTERM_AT] if at else ["-m", "trainer"]
    procs = [
        subprocess.Popen(
            [sys.executable, *launch, "--config", str(config)],
            cwd=config.parent,
            env={**pod_env(r, world, port), "SIGTERM_AT": at or "", "SIGTERM_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    try:
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:  # a pod left waiting for its peer (the bug this guards against) does not outlive the test
        for p in procs:
            p.kill()
    return [subprocess.CompletedProcess(["trainer"], p.returncode, out, "") for p, out in zip(procs, outs)]


def _final(out: Path) -> bytes:
    return (out / "final-model" / "model.safetensors").read_bytes()


def _mined(out: Path, r: int) -> bytes:
    return (out / "mined" / f"round-{r}" / "train.parquet").read_bytes()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_model) -> Path:
    tmp = tmp_path_factory.mktemp("uninterrupted")
    res = _run(_job(tmp, tiny_model))
    assert res.returncode == 0, res.stderr[-3000:]
    return tmp / "out"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("at", "stopped", "resumed"),
    [
        ("evaluation", "after round 1/2's training (its final model is saved)", "round 1/2: trained before"),
        ("between-rounds", "before round 2/2", "round 1/2: done before"),
        ("mining", "after writing mined part", "1 of 3 parts to do"),
    ],
    ids=["during-evaluation", "between-rounds", "during-mining"],
)
def test_a_sigterm_between_steps_stops_with_143_and_the_restart_ends_as_an_uninterrupted_job(
    tmp_path, tiny_model, uninterrupted, at, stopped, resumed
):
    config = _job(tmp_path, tiny_model)
    res = _run(config, at)
    assert res.returncode == EXIT_PREEMPTED, res.stderr[-3000:]
    said = [line for line in res.stderr.splitlines() if line.startswith("colbert-train: ")]
    assert len(said) == 1 and said[0].startswith(f"colbert-train: stopped by SIGTERM {stopped}"), res.stderr[-3000:]
    assert res.stderr.count("received SIGTERM") == 1 and "Traceback" not in res.stderr
    out = tmp_path / "out"
    assert not (out / "final-model").exists()  # round 2 was not trained
    if at == "evaluation":  # the phase that was running finished: round 1's final model is whole
        assert (out / "rounds" / "round-1" / "final-model" / "manifest.json").is_file()
    if at == "mining":  # the part in flight was written, the third was not begun
        assert len(list((out / "mined" / "round-1").glob("part-*.parquet"))) == 2

    again = _run(config)
    assert again.returncode == 0, again.stderr[-3000:]
    assert resumed in again.stderr
    assert _mined(out, 1) == _mined(uninterrupted, 1) and _mined(out, 2) == _mined(uninterrupted, 2)
    assert _final(out) == _final(uninterrupted)


@pytest.mark.slow
def test_a_sigterm_to_one_pod_while_mining_stops_every_pod_after_the_same_part(tmp_path, tiny_model, uninterrupted):
    """Every rank learns of the request at the same safe point (one collective per part), so all stop together:
    raised on the signalled pod alone, the others would wait for it in the next part's collective."""
    config = _job(tmp_path, tiny_model)
    stopped = _pods(config, 2, "mining", rank=1)
    assert [r.returncode for r in stopped] == [EXIT_PREEMPTED] * 2, (
        stopped[0].stdout[-3000:] + stopped[1].stdout[-3000:]
    )
    for r in stopped:
        assert "colbert-train: stopped by SIGTERM after writing mined part" in r.stdout
        assert "(2 of 3)" in r.stdout
    again = _pods(config, 2)
    assert [r.returncode for r in again] == [0, 0], again[0].stdout[-3000:]
    assert "1 of 3 parts to do" in again[0].stdout
    assert _mined(tmp_path / "out", 1) == _mined(uninterrupted, 1)  # mined rows: the same on any world size
