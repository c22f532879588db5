"""bench/encoder_precision.py measures the serving engine's own bfloat16 encoder against float32 (the wrapper on for
bf16's searches only, in an order that favours neither), and lab/results.py renders its records as one table."""

from __future__ import annotations

import doctest
import json

import pytest
import torch

import bench.encoder_precision as bench
import lab.results as results
from lab import record


@pytest.fixture(scope="module")
def beir(tmp_path_factory):
    from bench.serve import synthetic_beir

    return synthetic_beir(tmp_path_factory.mktemp("corpus") / "beir", 40, queries=12)


def _run(tmp_path, model, beir, *extra: str) -> dict:
    out = tmp_path / "result.json"
    threads = str(torch.get_num_threads())  # the bench sets torch's threads: leave this process's as they are
    bench.main(["--model", str(model), "--data", str(beir), "--split", "test", "--threads", threads, "--out", str(out)])
    return json.loads(out.read_text())


@pytest.mark.slow
def test_the_bench_runs_both_encoders_and_bf16_only_under_the_engines_autocast(tmp_path, tiny_model, beir, monkeypatch):
    """End to end on a tiny model and split: each search's encodes are spied on, so a bf16 search without the
    wrapper, or an fp32 one with it left on, shows; the token difference is bfloat16's rounding, not zero."""
    import trainer.evaluate

    real, under_autocast = trainer.evaluate.search, []

    def spied(model, split, batch_size=32):
        seen = []
        hook = model[0].register_forward_hook(lambda *_: seen.append(torch.is_autocast_enabled("cpu")))
        try:
            return real(model, split, batch_size)
        finally:
            hook.remove()
            assert seen and len(set(seen)) == 1  # every encode of a search in one precision
            under_autocast.append(seen[0])

    monkeypatch.setattr(trainer.evaluate, "search", spied)
    result = _run(tmp_path, tiny_model, beir)

    assert under_autocast == [False, True, True, False]  # fp32, bf16, bf16, fp32
    assert [r["encoder"] for r in result["runs"]] == ["fp32", "bf16", "bf16", "fp32"]
    assert set(result["encoders"]) == {"fp32", "bf16"}
    for figures in result["encoders"].values():
        assert all(0 <= figures[k] <= 1 for k in ("ndcg@10", "mrr@10", "recall@100")) and figures["seconds"] > 0
    for encoder in ("fp32", "bf16"):  # every run of an encoder scores as its first
        first = result["encoders"][encoder]["ndcg@10"]
        assert {r["ndcg@10"] for r in result["runs"] if r["encoder"] == encoder} == {first}
    assert 0 < result["max_token_difference"] < 0.05  # bfloat16 keeps 8 bits of mantissa: about 1e-3 on unit vectors
    p = result["paired_ndcg@10"]
    assert p["higher"] + p["lower"] + p["same"] == result["queries"] == 12 and p["low"] <= p["mean"] <= p["high"]
    assert p["mean"] == pytest.approx(result["encoders"]["bf16"]["ndcg@10"] - result["encoders"]["fp32"]["ndcg@10"])
    assert result["sample"] == [12, 32] and result["documents"] == 40 and result["split"] == "test"
    assert isinstance(result["bf16_native"], bool) and result["data"].startswith("corpus")  # beir/'s parent


def test_the_wrapper_is_the_engines_on_for_the_block_and_off_after_even_on_an_error():
    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.linear = torch.nn.Linear(64, 64)

        def forward(self, features: dict) -> dict:
            return {"token_embeddings": self.linear(features["x"])}

    model, x = Encoder(), {"x": torch.randn(4, 64)}
    fp32 = model(x)["token_embeddings"]
    with bench.encoding_in(model, "bf16", "cpu"):
        bf16 = model(x)["token_embeddings"]
    assert bf16.dtype == torch.float32 and 0 < (bf16 - fp32).abs().max() < 0.1
    assert "forward" not in vars(model) and torch.equal(model(x)["token_embeddings"], fp32)
    with pytest.raises(RuntimeError), bench.encoding_in(model, "bf16", "cpu"):
        raise RuntimeError("a search that fails")
    assert "forward" not in vars(model)
    with bench.encoding_in(model, "fp32", "cpu"):
        assert torch.equal(model(x)["token_embeddings"], fp32)


@pytest.mark.parametrize(
    "args, said",
    [
        (["--name", "bf16-quickstart"], "--name must start with encoder-precision"),
        (["--repeats", "0"], "--repeats must be at least 1, got 0"),
        (["--split", "nosuch"], "--split nosuch: no qrels/nosuch.tsv in"),
        (["--split", "nosuch"], "; one of test"),
        (["--data", "/nonexistent"], "--data /nonexistent: no corpus.jsonl or queries.jsonl; give a BEIR directory"),
        (["--model", "/nonexistent"], "--model /nonexistent: not a model directory (no config.json)"),
    ],
    ids=["name-off-the-page", "no-repeats", "missing-split", "the-splits-there", "no-data", "no-model"],
)
def test_bad_input_is_one_line(tmp_path, beir, capsys, args, said):
    (tmp_path / "config.json").write_text("{}")  # a model directory as far as the checks before loading look
    with pytest.raises(SystemExit) as e:
        bench.main(["--model", str(tmp_path), "--data", str(beir), *args])
    message = str(e.value.code) if isinstance(e.value.code, str) else capsys.readouterr().err.strip().splitlines()[-1]
    assert said in message and "\n" not in message


def _record(**extra) -> dict:
    encoders = {
        "fp32": {"ndcg@10": 0.61234, "mrr@10": 0.55, "recall@100": 0.9, "seconds": 12.0},
        "bf16": {"ndcg@10": 0.60987, "mrr@10": 0.54, "recall@100": 0.9, "seconds": 7.5},
    }
    return {
        "date": "2026-01-01",
        "commit": "abc1234",
        "machine": "x86_64, 2 cores, Python 3.11",
        "load": "0.5 to 0.6",
        "model": "run/out/final-model",
        "data": "scifact",
        "split": "test",
        "queries": 300,
        "documents": 5183,
        "device": "cpu",
        "threads": 1,
        "batch_size": 8,
        "query_length": 32,
        "document_length": 180,
        "torch": "2.11.0",
        "bf16_native": False,
        "encoders": encoders,
        "runs": [
            {"encoder": e, "seconds": s, "ndcg@10": encoders[e]["ndcg@10"]}
            for e, s in (("fp32", 11.5), ("bf16", 7.0), ("bf16", 8.0), ("fp32", 12.5))
        ],
        "paired_ndcg@10": {"mean": -0.00247, "low": -0.006, "high": 0.0011, "higher": 20, "lower": 31, "same": 249},
        "max_token_difference": 0.0031,
        "sample": [32, 32],
        **extra,
    }


def test_the_page_shows_every_split_in_one_table_a_row_per_encoder(tmp_path, monkeypatch):
    path = tmp_path / "results.jsonl"
    record.put_named(path, "benchmarks", "plaid-recall", {"rows": []})
    record.put_named(path, "benchmarks", "encoder-precision-scifact", _record())
    quickstart = _record(data="quickstart", split="dev", queries=129, documents=343, bf16_native=True)
    record.put_named(path, "benchmarks", "encoder-precision-quickstart", quickstart)
    monkeypatch.setattr(results, "study", lambda name: path)

    text = results.encoder_precision_table()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "encoder |" not in line]
    assert [row.split(" | ")[:2] for row in rows] == [
        ["| quickstart dev (129, 343)", "fp32"],
        ["| quickstart dev (129, 343)", "bf16"],
        ["| scifact test (300, 5,183)", "fp32"],
        ["| scifact test (300, 5,183)", "bf16"],
    ]
    assert rows[3] == (
        "| scifact test (300, 5,183) | bf16 | 0.6099 | 0.5400 | 0.9000 | 7.5 (7.0–8.0) | -0.0025 [-0.0060, +0.0011] "
        "| 20 / 31 / 249 | 0.0031 |"
    )
    assert rows[2].endswith("| 12.0 (11.5–12.5) | - | - | - |")
    assert "`encoder-precision-scifact`: 2026-01-01, commit `abc1234`" in text and "bfloat16 emulated" in text
    assert "`encoder-precision-quickstart`" in text and "bfloat16 native" in text
    assert "searches in the order fp32, bf16, bf16, fp32" in text

    record.write(path, [{"kind": "benchmarks"}])
    assert results.encoder_precision_table().startswith("Not measured yet: `python bench/encoder_precision.py")


def test_the_section_is_on_the_results_page_and_a_block():
    assert "### The bfloat16 encoder against float32\n" in results.page()
    assert "encoder-precision" in results.BLOCKS


def test_the_examples_in_the_bench_run():
    assert doctest.testmod(bench).failed == 0
