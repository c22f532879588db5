"""The encoder in ONNX (trainer/onnx_export.py, ``colbert-k8s export-onnx``, ``onnx:``, ``serve --onnx``): it
tokenizes as PyLate does, its float32 token embeddings are PyTorch's, its parity is measured and written into the
card, and serving with it answers as serving with PyTorch; int8 past its margin and a missing export are one line.
The reference is always PyLate's own model, called directly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.helpers import ROOT
from tests.helpers.serving import SERVE_PYTHON, SKIP_REASON, Predictor, served_output

needs_kserve = pytest.mark.skipif(not SERVE_PYTHON.exists(), reason=SKIP_REASON)

TEXTS = [
    "short",
    "a much longer text, with punctuation! and more words than sixteen tokens can ever hold, surely; yes.",
    "  Mixed CASE text with spaces around  ",
]


def _config(root: Path, out: Path, **extra):
    from trainer.config.load import parse_config

    return parse_config(
        {
            "model": {"name_or_path": "unused", "query_length": 16, "document_length": 48},
            "data": {"train": {"path": "t.jsonl"}, "eval_beir": str(root / "beir")},
            "training": {"max_steps": 1},
            "index": {"embeddings": True},
            "output_dir": str(out),
            **extra,
        }
    )


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_model):
    """A finished job's output_dir whose config gained ``onnx:``: the job's own phase writes the export."""
    from pylate import models

    from trainer import phases
    from trainer.evaluate import load_beir

    root = tmp_path_factory.mktemp("onnx")
    out = served_output(root, tiny_model)
    metrics = {**json.loads((out / "metrics.json").read_text()), "model_dir": str(out / "final-model")}
    cfg = _config(root, out, onnx={})
    assert phases.redo_from(cfg)[0] == "onnx"
    phases.finish(cfg, metrics)
    model = models.ColBERT(str(out / "final-model"), device="cpu")
    model.eval()
    return out, model, load_beir(root / "beir"), cfg


@pytest.mark.slow
def test_the_jobs_onnx_phase_writes_a_whole_export_the_card_and_the_marker(exported):
    from trainer import phases
    from trainer.run.checkpoint import verify

    out, _, _, cfg = exported
    folder = out / "final-model" / "onnx"
    assert {"model.onnx", "model_int8.onnx", "colbert.json", "parity.json", "manifest.json"} <= {
        p.name for p in folder.iterdir()
    }
    assert not [p for p in (out / "final-model").iterdir() if p.name.startswith(".tmp")]
    assert verify(folder, required=True) is None
    listed = json.loads((out / "final-model" / "manifest.json").read_text())["files"]
    assert "onnx/model.onnx" in listed and verify(out / "final-model", required=True) is None
    assert phases.redo_from(cfg) == (None, "")
    metrics = json.loads((out / "metrics.json").read_text())
    card = (out / "final-model" / "README.md").read_text()
    assert "## ONNX" in card and f"{metrics['onnx']['ndcg@10_fp32']:.4f}" in card


@pytest.mark.slow
@pytest.mark.parametrize("is_query", [True, False], ids=["query", "document"])
def test_it_tokenizes_as_pylate_prefix_expansion_and_lengths(exported, is_query):
    from trainer.onnx_export import OnnxEncoder

    _, model, _, _ = exported
    encoder = OnnxEncoder(exported[0] / "final-model" / "onnx")
    for texts in (TEXTS, TEXTS[:1]):  # alone, a short query is still padded with [MASK] to the query length
        want = model.tokenize(texts, is_query=is_query)
        got = encoder.tokenize(texts, is_query=is_query)
        assert sorted(got) == sorted(want)
        for key in want:
            assert got[key].tolist() == want[key].tolist(), key


@pytest.mark.slow
@pytest.mark.parametrize("form,bound", [("fp32", 1e-4), ("int8", 0.05)], ids=["fp32", "int8"])
@pytest.mark.parametrize("is_query", [True, False], ids=["query", "document"])
def test_token_embeddings_are_pylates_encode(exported, form, bound, is_query):
    """Each text's token embeddings, the tokens PyLate keeps (a query's [MASK]s, a document's skiplist dropped),
    within ``bound`` of PyLate's ``encode``: float32 to rounding, int8 to its quantisation."""
    import numpy as np

    from trainer.onnx_export import OnnxEncoder

    _, model, split, _ = exported
    texts = TEXTS + split.corpus[:5] + ["alone"]
    want = model.encode(texts, is_query=is_query, batch_size=4)
    got = OnnxEncoder(exported[0] / "final-model" / "onnx", form).encode(texts, is_query=is_query, batch_size=4)
    for w, g in zip(want, got):
        assert g.shape == w.shape
        assert float(np.abs(g - w).max()) < bound


@pytest.mark.slow
def test_parity_is_measured_against_pytorch_on_the_held_out_split(exported):
    from trainer.evaluate import evaluate

    out, model, split, _ = exported
    parity = json.loads((out / "final-model" / "onnx" / "parity.json").read_text())
    assert parity["ndcg@10_torch"] == pytest.approx(evaluate(model, split)["ndcg@10"], abs=1e-4)
    assert parity["ndcg@10_fp32"] == pytest.approx(parity["ndcg@10_torch"], abs=1e-3)
    assert parity["max_token_error_fp32"] < 1e-4 < parity["max_token_error_int8"] < 0.05
    assert parity["int8_loss"] == pytest.approx(parity["ndcg@10_torch"] - parity["ndcg@10_int8"], abs=1e-4)
    assert parity["int8_ok"] == (parity["int8_loss"] <= parity["max_int8_loss"] == 0.01)
    assert parity["queries"] == len(split.queries) and parity["documents"] == len(split.corpus)


@pytest.mark.slow
@pytest.mark.parametrize("exact", [True, False], ids=["exact", "plaid"])
def test_the_onnx_engine_answers_as_the_pytorch_engine_batched(exported, exact):
    """Search (exact and PLAID) and rerank, several requests in one batch as the batcher sends them."""
    from trainer.serve.engine import Engine, locate
    from trainer.serve.requests import Rerank, Search

    out, _, split, _ = exported
    where = locate(str(out), out / "cache")
    torch_engine, onnx_engine = (Engine(*where, exact=exact, device="cpu", onnx=o) for o in (None, "fp32"))
    assert onnx_engine.describe().endswith("encoder: ONNX fp32")
    batch = [Search(split.queries[:3], 10), Rerank(split.queries[3], split.corpus[:6]), Search(split.queries[3:6], 5)]
    want, got = torch_engine.answer(batch), onnx_engine.answer(batch)
    for w, g in ((want[0], got[0]), (want[2], got[2])):
        assert [ids for ids, _ in g] == [ids for ids, _ in w]
        for (_, ws), (_, gs) in zip(w, g):
            assert gs == pytest.approx(ws, abs=1e-3)
    assert got[1] == pytest.approx(want[1], abs=1e-4)


def _int8_lost(out: Path, tmp_path: Path) -> Path:
    """A copy of ``out`` whose parity says int8 lost more than allowed, its manifests rewritten to match."""
    import shutil

    from trainer.run.checkpoint import write_manifest

    copy = tmp_path / "output"
    shutil.copytree(out, copy)
    folder = copy / "final-model" / "onnx"
    parity = json.loads((folder / "parity.json").read_text())
    (folder / "parity.json").write_text(json.dumps({**parity, "int8_loss": 0.05, "int8_ok": False}))
    write_manifest(folder)
    write_manifest(copy / "final-model")
    return copy


@pytest.mark.slow
def test_int8_past_its_margin_and_a_missing_export_are_one_line(exported, tmp_path):
    from trainer.serve import ServeError
    from trainer.serve.engine import Engine, locate

    copy = _int8_lost(exported[0], tmp_path)
    where = locate(str(copy), tmp_path / "cache")
    with pytest.raises(ServeError) as e:
        Engine(*where, exact=False, device="cpu", onnx="int8")
    assert "loses 0.0500 nDCG@10" in str(e.value) and "--allow-int8-loss" in str(e.value)
    assert "\n" not in str(e.value)
    assert Engine(*where, exact=False, device="cpu", onnx="int8", allow_int8_loss=True).search(["q"], 3)
    (copy / "final-model" / "onnx" / "model.onnx").write_bytes(b"not the bytes")
    with pytest.raises(ServeError, match="the ONNX export .* is not whole"):
        Engine(*where, exact=False, device="cpu", onnx="fp32")
    import shutil

    shutil.rmtree(copy / "final-model" / "onnx")
    with pytest.raises(ServeError, match="has no ONNX export .*`colbert-k8s export-onnx "):
        Engine(*where, exact=False, device="cpu", onnx="fp32")


@pytest.mark.slow
def test_a_failed_export_leaves_the_old_one_and_no_temporary(exported, monkeypatch):
    from trainer import onnx_export

    folder = exported[0] / "final-model" / "onnx"
    before = (folder / "manifest.json").read_bytes()

    def broken(model, tmp):
        (tmp / "model.onnx").write_bytes(b"half")
        raise OSError("the disk went away")

    monkeypatch.setattr(onnx_export, "_write_graphs", broken)
    with pytest.raises(OSError):
        onnx_export.export(folder.parent)
    assert (folder / "manifest.json").read_bytes() == before
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".tmp")]


def test_card_says_when_int8_lost_more_than_allowed():
    from trainer.storage.card import _onnx_section

    parity = {"sample": 64, "max_token_error_fp32": 3e-7, "max_token_error_int8": 0.02, "max_int8_loss": 0.01}
    scored = {"ndcg@10_torch": 0.62, "ndcg@10_fp32": 0.62, "ndcg@10_int8": 0.58, "int8_loss": 0.04}
    assert "**int8 loses 0.0400 nDCG@10, more than the 0.01 allowed**" in _onnx_section(
        {"onnx": {**parity, **scored, "int8_ok": False}}
    )
    assert "within the 0.01 allowed" in _onnx_section({"onnx": {**parity, **scored, "int8_loss": 0.0, "int8_ok": True}})
    assert "not measured" in _onnx_section({"onnx": {**parity, "int8_ok": False}})


@pytest.mark.parametrize(
    "args,message",
    [
        (["export-onnx", "s3://models/run-1/"], "takes a local directory"),
        (["export-onnx", "/nonexistent/model"], "holds no ColBERT model"),
        (["export-onnx", ".", "--max-int8-loss", "2"], "2.0 is not in the range 0<=x<=1"),
        (["serve", "--onnx", "int8", "list"], "--onnx, --allow-int8-loss and --precision go with --local"),
        (["serve", "--local", "x", "--onnx", "int4"], "'int4' is not one of 'fp32', 'int8'"),
    ],
    ids=["remote", "no model", "margin out of range", "onnx with a subcommand", "unknown form"],
)
def test_bad_cli_input_is_one_line(args, message):
    from operator_cli.cli import cli

    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_the_config_takes_onnx_and_refuses_a_bad_margin(tmp_path):
    from trainer.config.schema import ConfigError

    assert _config(tmp_path, tmp_path / "o", onnx={}).onnx.max_int8_loss == 0.01
    with pytest.raises((ConfigError, ValueError), match="max_int8_loss"):
        _config(tmp_path, tmp_path / "o", onnx={"max_int8_loss": 2})


@pytest.mark.slow
@needs_kserve
def test_served_with_onnx_answers_the_pytorch_top_10_and_refuses_int8_in_one_line(exported, tmp_path):
    from trainer.serve.engine import Engine, locate

    out, _, split, _ = exported
    want = Engine(*locate(str(out), out / "cache"), exact=True, device="cpu").search(split.queries[:5], 10)
    server = Predictor(str(out), "--exact", "--onnx")
    try:
        status, body = server.v1([{"query": q, "k": 10} for q in split.queries[:5]])
        assert status == 200, body
        assert [p["ids"] for p in body["predictions"]] == [ids for ids, _ in want]
        assert "encoder: ONNX fp32" in server.output()
    finally:
        server.close()
    copy = _int8_lost(out, tmp_path)
    cmd = [sys.executable, "-m", "operator_cli.cli", "serve", "--local", str(copy), "--onnx", "int8"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    lines = [line for line in done.stderr.splitlines() if line.strip() and "WARNING" not in line]
    assert done.returncode == 2 and len(lines) == 1 and "--allow-int8-loss" in lines[0], done.stderr


# export-onnx on a job's output_dir records the parity as the job's onnx: phase does (trainer/phases.py's record)


def _finished(out: Path, cfg) -> None:
    """``out`` as the job leaves it: the card the final save writes, then the job's own finish (its config
    recorded, done.json), every other metrics.json key kept."""
    from trainer import phases
    from trainer.storage import card

    metrics = {**json.loads((out / "metrics.json").read_text()), "steps": 1, "model_dir": str(out / "final-model")}
    (out / "metrics.json").write_text(json.dumps(metrics))
    card.update(out / "final-model", cfg, metrics)
    phases.finish(cfg, metrics)
    assert phases.redo_from(cfg) == (None, "") and (out / phases.CONFIG).is_file()


@pytest.fixture(scope="module")
def finished_job(tmp_path_factory, tiny_model):
    """A finished job's output_dir whose config has no ``onnx:``: the model, its index, card, config and marker."""
    root = tmp_path_factory.mktemp("job")
    out = served_output(root, tiny_model)
    _finished(out, _config(root, out))
    return root, out


def _state(out: Path) -> dict[str, bytes]:
    """The files the record writes, as bytes."""
    names = ["metrics.json", "done.json", "final-model/README.md", "final-model/manifest.json"]
    return {name: (out / name).read_bytes() for name in names}


@pytest.mark.slow
def test_export_onnx_on_a_job_output_records_the_parity_as_the_jobs_phase(finished_job, tmp_path):
    import shutil

    from operator_cli.cli import cli
    from trainer import phases
    from trainer.run.checkpoint import verify

    root, out = finished_job
    copy = tmp_path / "output"
    shutil.copytree(out, copy)
    before = json.loads((copy / "metrics.json").read_text())
    card_before = (copy / "final-model" / "README.md").read_text()
    result = CliRunner().invoke(cli, ["export-onnx", str(copy), "--heldout", str(root / "beir")])
    assert result.exit_code == 0, result.output
    parity = json.loads((copy / "final-model" / "onnx" / "parity.json").read_text())
    metrics = json.loads((copy / "metrics.json").read_text())
    assert metrics == {**before, "onnx": parity}  # every other key kept
    card = (copy / "final-model" / "README.md").read_text()
    assert "## ONNX" in card and f"{parity['ndcg@10_fp32']:.4f}" in card and f"{parity['ndcg@10_int8']:.4f}" in card
    assert f"{parity['max_token_error_int8']:.2g}" in card
    assert [line for line in card_before.splitlines() if line not in card] == []  # the rest of the card as it was
    assert "onnx/model.onnx" in json.loads((copy / "final-model" / "manifest.json").read_text())["files"]
    assert verify(copy / "final-model", required=True) is None
    for cfg in (_config(root, copy), _config(root, copy, onnx={})):  # a restart trains nothing, exports nothing
        assert phases.redo_from(cfg) == (None, ""), cfg.onnx


def _fake_job(tmp_path: Path, monkeypatch) -> Path:
    """A finished job's output_dir of the production layout (tests/helpers/outputs.py), an export that writes
    nothing and gives a parity: the record alone is under test."""
    from tests.helpers.outputs import fake_output, phases_config
    from trainer import onnx_export

    out = tmp_path / "output"
    fake_output(out, index=True)
    (out / "final-model" / "config_sentence_transformers.json").write_text("{}")
    metrics = json.loads((out / "metrics.json").read_text())
    (out / "metrics.json").write_text(
        json.dumps({**metrics, "index": {**metrics["index"], "path": str(out / "index")}})
    )
    _finished(out, phases_config(out, index=True))
    parity = {"sample": 8, "max_token_error_fp32": 2e-7, "max_token_error_int8": 0.0123, "max_int8_loss": 0.01}
    monkeypatch.setattr(onnx_export, "export", lambda *a, **k: {**parity, "int8_ok": False})
    return out


def test_a_failed_card_record_leaves_metrics_and_the_card_as_they_were(tmp_path, monkeypatch):
    """The card (and the model's manifest) written, then metrics.json fails: all of them are put back."""
    import errno

    from operator_cli.cli import cli
    from trainer import phases

    out = _fake_job(tmp_path, monkeypatch)
    before = _state(out)
    real = phases.write_text

    def full(path, text):
        if path.name == "metrics.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, text)

    monkeypatch.setattr(phases, "write_text", full)
    result = CliRunner().invoke(cli, ["export-onnx", str(out)])
    assert result.exit_code == 2 and "not updated and are as they were" in result.stderr, result.output
    assert "Traceback" not in result.output
    assert _state(out) == before
    assert not [p for p in (*out.iterdir(), *(out / "final-model").iterdir()) if p.name.startswith(".")]
    monkeypatch.setattr(phases, "write_text", real)
    assert CliRunner().invoke(cli, ["export-onnx", str(out / "final-model")]).exit_code == 0  # the model dir too
    assert "0.012" in (out / "final-model" / "README.md").read_text()
    assert phases.redo_from(phases.recorded_config(out)) == (None, "")


@pytest.mark.parametrize(
    "case,code,said",
    [
        ("no recorded config", 0, "no job-config.json (a job of an earlier colbert-k8s records none)"),
        ("damaged recorded config", 2, "job-config.json is unreadable (JSONDecodeError)"),
        ("no job around the model", 0, "the card is not updated: there is no job output around the model"),
    ],
)
def test_without_a_job_or_its_config_the_card_is_left_and_one_line_says_why(tmp_path, monkeypatch, case, code, said):
    from operator_cli.cli import cli
    from trainer.phases import CONFIG

    out = _fake_job(tmp_path, monkeypatch)
    target = out
    if case == "no recorded config":
        (out / CONFIG).unlink()
    elif case == "damaged recorded config":
        (out / CONFIG).write_text("{")
    else:
        (out / "metrics.json").rename(tmp_path / "elsewhere.json")
        target = out / "final-model"
    before = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    result = CliRunner().invoke(cli, ["export-onnx", str(target)])
    assert result.exit_code == code and said in result.stderr, result.output
    assert len([line for line in result.stderr.splitlines() if said in line]) == 1
    assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file()} == before
