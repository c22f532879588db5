"""What the bfloat16 encoder costs in retrieval quality against float32, with a trained model, on a real BEIR split.

    python bench/encoder_precision.py --model RUN/out/final-model --data PATH --split dev \\
        --record lab/benchmarks/results.jsonl --name encoder-precision-NAME

``serve --precision bf16`` encodes under torch's bfloat16 autocast through one wrapper of the model's ``forward``
(``trainer.serve.engine.autocast_bf16``, float32 outputs). This loads the model once, as the server does (PyLate's
ColBERT with its own query and document lengths, unless ``--document-length``), and measures two encoders with the
evaluation's exact search (``trainer/evaluate.py``, which encodes every query and document through ``forward``):
``fp32``, the model as loaded, and ``bf16``, the same model with the engine's wrapper on its ``forward``, put on for
each of its runs and taken off after. For each: nDCG@10, MRR@10, Recall@100 and the search's wall seconds.

* **Token difference**: the largest absolute difference of any token embedding between the two encoders over the
  first 32 queries and 32 documents (``trainer/onnx_export.py``'s parity measure). These encodes come first and
  warm both encoders up.
* **Order**: the searches then run in pairs, each pair the reverse of the last (``--repeats 2``, the default: fp32,
  bf16, bf16, fp32), so neither encoder always runs second on a warmed machine or always meets the same drift in
  load. An encoder's seconds are the median of its runs; its quality figures are its first run's, and every run's
  nDCG@10 is kept (the same for each run of an encoder: the wrapper is off when fp32 runs).
* **Paired**: bf16 − fp32 nDCG@10 query by query, its mean with a 95% bootstrap interval over queries (the
  studies' own, ``lab.record.paired``), and how many queries bf16 scores higher, lower and the same.
* Whether the device computes bfloat16 natively (``trainer.serve.engine.bf16_is_native``): where it does not,
  torch emulates it and bf16 is slower than fp32; its quality figures hold either way.

One record line a split (``--name encoder-precision-quickstart``, ``encoder-precision-scifact``, ...); the results
page shows every ``encoder-precision`` line in one table, a row per split and encoder.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import output_arguments, provenance, write_result
from lab.results import ENCODER_PRECISION, encoder_precision_rows
from trainer.serve.options import PRECISIONS


def order(repeats: int) -> list[str]:
    """The searches' order: pairs, each the reverse of the last.

    >>> order(1), order(2), order(3)
    (['fp32', 'bf16'], ['fp32', 'bf16', 'bf16', 'fp32'], ['fp32', 'bf16', 'bf16', 'fp32', 'fp32', 'bf16'])
    """
    return [p for r in range(repeats) for p in (PRECISIONS if r % 2 == 0 else PRECISIONS[::-1])]


@contextlib.contextmanager
def encoding_in(model, precision: str, device_type: str) -> Iterator[None]:
    """``model`` encodes in ``precision`` inside the block: for bf16, with the serving engine's own wrapper on its
    ``forward``, taken off after (the model's ``forward`` is then what it was)."""
    if precision == "fp32":
        yield
        return
    from trainer.serve.engine import autocast_bf16

    own = vars(model).get("forward")  # a forward set on the instance, kept; else the class's
    model.forward = autocast_bf16(model.forward, device_type)
    try:
        yield
    finally:
        if own is None:
            del model.forward
        else:
            model.forward = own


def paired_difference(bf16: dict[str, float], fp32: dict[str, float]) -> dict:
    """bf16 − fp32 of a per-query figure: the mean, its 95% bootstrap interval over queries, and how many queries
    bf16 scores higher, lower and the same.

    >>> d = paired_difference({"a": 0.5, "b": 1.0, "c": 0.2}, {"a": 0.5, "b": 0.5, "c": 0.3})
    >>> round(d["mean"], 4), d["higher"], d["lower"], d["same"]
    (0.1333, 1, 1, 1)
    """
    from lab.record import paired

    def run(per_query: dict[str, float]) -> dict[int, dict]:
        return {0: {"ndcg@10": statistics.fmean(per_query.values()), "per_query": per_query}}

    p = paired(run(bf16), run(fp32))
    diffs = [bf16[q] - fp32[q] for q in fp32]
    return {
        "mean": p["gain"],
        "low": p["low"],
        "high": p["high"],
        "higher": sum(d > 0 for d in diffs),
        "lower": sum(d < 0 for d in diffs),
        "same": sum(d == 0 for d in diffs),
    }


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a trained ColBERT (a job's final-model)")
    parser.add_argument("--data", type=Path, required=True, help="a BEIR directory")
    parser.add_argument("--split", default="dev", help="its qrels/SPLIT.tsv: a split the model was not trained on")
    parser.add_argument("--document-length", type=int, help="tokens a document (default: the model's own)")
    parser.add_argument("--batch-size", type=int, default=8, help="texts encoded at a time (the server's, on a CPU)")
    parser.add_argument("--threads", type=int, default=1, help="torch's CPU threads")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda")
    parser.add_argument("--repeats", type=int, default=2, help="searches by each encoder, in reversed pairs")
    output_arguments(parser, ENCODER_PRECISION)
    args = parser.parse_args(argv)
    for flag in ("document_length", "batch_size", "threads", "repeats"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    if not args.name.startswith(ENCODER_PRECISION):
        parser.error(
            f"--name must start with {ENCODER_PRECISION} (the results page shows those lines), got {args.name}"
        )
    return args


def load(args: argparse.Namespace):
    """The split and the model, as the server loads it; bad input is one line."""
    import torch
    from pylate import models

    from trainer.config.schema import ConfigError
    from trainer.data import DataError
    from trainer.evaluate import load_beir

    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: no CUDA GPU here; measure on --device cpu")
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"--model {args.model}: not a model directory (no config.json); give a job's final-model")
    missing = [f for f in ("corpus.jsonl", "queries.jsonl") if not (args.data / f).is_file()]
    if missing:
        raise SystemExit(f"--data {args.data}: no {' or '.join(missing)}; give a BEIR directory")
    if not (args.data / "qrels" / f"{args.split}.tsv").is_file():
        splits = sorted(p.stem for p in (args.data / "qrels").glob("*.tsv")) or ["none"]
        raise SystemExit(f"--split {args.split}: no qrels/{args.split}.tsv in {args.data}; one of {', '.join(splits)}")
    try:
        split = load_beir(args.data, args.split)
    except (ConfigError, DataError) as e:
        raise SystemExit(f"--data {args.data} --split {args.split}: {e}") from None
    lengths = {"document_length": args.document_length} if args.document_length else {}
    try:
        model = models.ColBERT(str(args.model), device=args.device, **lengths).eval()
    except (OSError, ValueError) as e:
        raise SystemExit(f"--model {args.model}: not loaded ({str(e).splitlines()[0][:160]})") from None
    return model, split


def measure(model, split, batch_size: int, repeats: int) -> dict:
    """The token difference, then each encoder's searches in :func:`order`: the figures of the result."""
    from trainer.evaluate import retrieval_metrics, search
    from trainer.onnx_export import largest_difference, parity_sample, token_embeddings

    device = next(model.parameters()).device
    qrels = {q: split.qrels[q] for q in split.query_ids}
    sample = parity_sample(split)
    reference = token_embeddings(model, sample, model, batch_size, device)
    with encoding_in(model, "bf16", device.type):
        difference = largest_difference(token_embeddings(model, sample, model, batch_size, device), reference)

    runs, first = [], {}
    for precision in order(repeats):
        with encoding_in(model, precision, device.type):
            started = time.perf_counter()
            found = search(model, split, batch_size)
            seconds = time.perf_counter() - started
        metrics = retrieval_metrics(found, qrels)
        runs.append({"encoder": precision, "seconds": round(seconds, 2), "ndcg@10": metrics["ndcg@10"]})
        if precision not in first:  # per query: the metric of a run of that query alone
            per_query = {q: retrieval_metrics({q: found.get(q, {})}, {q: qrels[q]})["ndcg@10"] for q in qrels}
            first[precision] = (metrics, per_query)
    encoders = {
        p: {
            **{k: first[p][0][k] for k in ("ndcg@10", "mrr@10", "recall@100")},
            "seconds": round(statistics.median(r["seconds"] for r in runs if r["encoder"] == p), 2),
        }
        for p in PRECISIONS
    }
    return {
        "encoders": encoders,
        "runs": runs,
        "paired_ndcg@10": paired_difference(first["bf16"][1], first["fp32"][1]),
        "max_token_difference": difference,
        "sample": [len(sample[0]), len(sample[1])],
    }


def _data_name(data: Path) -> str:
    """The split's name in the table: its folder's, or, for a folder named ``beir`` (the layout the quickstart and
    the bench corpora write), the folder above it.

    >>> _data_name(Path("/data/scifact")), _data_name(Path("/tmp/quickstart/beir"))
    ('scifact', 'quickstart')
    """
    folder = data.resolve()
    return folder.parent.name if folder.name == "beir" else folder.name


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    load_before = os.getloadavg()[0]

    import torch

    from trainer.serve.engine import bf16_is_native

    model, split = load(args)
    torch.set_num_threads(args.threads)
    figures = measure(model, split, args.batch_size, args.repeats)
    result = {
        **provenance(load_before),
        "model": str(args.model),
        "data": _data_name(args.data),
        "split": args.split,
        "queries": len(split.queries),
        "documents": len(split.corpus),
        "device": args.device,
        "threads": torch.get_num_threads(),
        "batch_size": args.batch_size,
        "query_length": model.query_length,
        "document_length": model.document_length,
        "torch": torch.__version__.split("+")[0],
        "bf16_native": bf16_is_native(args.device),
        **figures,
    }
    write_result(result, args)
    print(encoder_precision_rows({args.name: result}))


if __name__ == "__main__":
    main()
