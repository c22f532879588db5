"""The predictor's options: each flag of ``python -m trainer.serve``, else the ``COLBERT_SERVE_*`` environment
variable that ``serve render|apply`` writes into the InferenceService's container (the ClusterServingRuntime's
command is every model's), typed and checked once, in :func:`parse`. A bad variable is :class:`ServeError`'s one
line naming it: argparse does not check an environment default's choices."""

from __future__ import annotations

import argparse
import os

from trainer.serve import ServeError
from trainer.serve.batcher import add_batch_arguments, batch_options

__all__ = ["PRECISIONS", "parse", "parser"]

_ONNX_FORMS = ("fp32", "int8")
_ONNX_ENV = "COLBERT_SERVE_ONNX"
PRECISIONS = ("fp32", "bf16")  # the PyTorch encoder's (trainer/serve/engine.py): float32, or bfloat16 autocast
_PRECISION_ENV = "COLBERT_SERVE_PRECISION"
_SWITCHES = {"exact": "COLBERT_SERVE_EXACT", "allow_int8_loss": "COLBERT_SERVE_ALLOW_INT8_LOSS"}
_SWITCH = {"1": True, "0": False, "": False}  # what `serve render|apply` writes, and unset
_CACHE_ENV = "COLBERT_SERVE_CACHE"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The predictor's options, each typed and checked here once: a flag as given (argparse checks it), else
    its environment variable (what ``serve render|apply`` writes into the container), else off. ``exact`` and
    ``allow_int8_loss`` are booleans, ``onnx`` a form or None, ``precision`` fp32 or bf16, ``batching``
    :class:`BatchOptions`; a bad
    variable is :class:`ServeError`'s one line naming it."""
    args = parser().parse_args(argv)
    for name, variable in _SWITCHES.items():
        if not getattr(args, name):  # the flag, given, wins
            value = os.environ.get(variable, "")
            if value not in _SWITCH:
                raise ServeError(f"{variable} must be 1 or 0 (or unset), got {value!r}")
            setattr(args, name, _SWITCH[value])
    if args.onnx is None:
        value = os.environ.get(_ONNX_ENV, "")
        if value not in ("", *_ONNX_FORMS):
            raise ServeError(f"{_ONNX_ENV} must be {' or '.join(_ONNX_FORMS)} (or unset), got {value!r}")
        args.onnx = value or None
    if args.precision is None:
        value = os.environ.get(_PRECISION_ENV, "")
        if value not in ("", *PRECISIONS):
            raise ServeError(f"{_PRECISION_ENV} must be {' or '.join(PRECISIONS)} (or unset), got {value!r}")
        args.precision = value or "fp32"
    args.cache_dir = args.cache_dir or os.environ.get(_CACHE_ENV) or ".cache/colbert-k8s"
    args.batching = batch_options(args)
    return args


def parser() -> argparse.ArgumentParser:
    """The flags alone: :func:`parse` reads each one's environment variable and types it."""
    about = "The KServe predictor of a trained ColBERT: search and rerank."
    p = argparse.ArgumentParser(prog="python -m trainer.serve", description=about)
    p.add_argument("uri", help="an export (s3://BUCKET/PREFIX/, gs://, az://, a local copy) or a job's output_dir")
    p.add_argument("--model-name", default="colbert", help="the name in the URLs (default: colbert)")
    p.add_argument(
        "--host",
        default="0.0.0.0",
        help="the address to listen on (default: 0.0.0.0, the pod's every interface; serve --local: 127.0.0.1)",
    )
    p.add_argument("--http-port", type=int, default=8080)
    p.add_argument(
        "--exact",
        action="store_true",
        default=None,
        help=f"search by exact MaxSim over the stored corpus embeddings (or {_SWITCHES['exact']}=1)",
    )
    p.add_argument(
        "--onnx",
        nargs="?",
        const="fp32",
        choices=_ONNX_FORMS,
        help="encode with the model's ONNX export (onnx/, colbert-k8s export-onnx) in ONNX Runtime on the CPU: "
        f"fp32 (the default form) or int8 (or {_ONNX_ENV})",
    )
    p.add_argument(
        "--allow-int8-loss",
        action="store_true",
        default=None,
        help="serve --onnx int8 even where its parity says it loses more nDCG@10 than allowed "
        f"(or {_SWITCHES['allow_int8_loss']}=1)",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="the PyTorch encoder's: bf16 runs it under bfloat16 autocast, about half the time on a GPU or a CPU "
        f"with AVX512-BF16 or AMX-BF16 (default fp32; or {_PRECISION_ENV})",
    )
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when a GPU is visible)")
    p.add_argument(
        "--cache-dir", help=f"where a remote export is staged (default: ${_CACHE_ENV}, else .cache/colbert-k8s)"
    )
    add_batch_arguments(p)
    return p
