"""``export-onnx``: a trained model's encoder written in ONNX beside it, checked against PyTorch, for ``serve --onnx``.

    colbert-k8s export-onnx output/ --heldout data/beir --split dev
    colbert-k8s export-onnx path/to/final-model [--max-int8-loss 0.01]

What a job's ``onnx:`` section does after training (``trainer/onnx_export.py``), for a model that exists: a job's
``output_dir`` (its ``final-model/``) or a PyLate model directory. ``onnx/`` is written beside the model's
weights, whole or not at all: ``model.onnx`` (float32), ``model_int8.onnx`` (int8 weights), the tokenizer and
its settings, and ``parity.json``: the largest token-embedding error of each form against the PyTorch model and,
with ``--heldout``, nDCG@10 of each on that split. It runs here and needs the trainer's packages (torch, PyLate,
onnxruntime): ``pip install 'colbert-k8s[train]'``. Importing this module imports none of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from operator_cli.commands.base import Command, missing_modules, trainer_log_to_stderr
from operator_cli.errors import CliError

__all__ = ["export_onnx_cmd"]

_EXTRA = "pip install 'colbert-k8s[train]'"


def _model_dir(given: str) -> Path:
    """The PyLate model directory in ``given`` (a job's output_dir: its final-model/)."""
    if "://" in given:
        raise CliError(
            f"{given}: export-onnx writes beside the model, so it takes a local directory",
            hint="copy the export here first (rclone, or the store's CLI), then give its directory",
        )
    root = Path(given)
    for model in (root / "final-model", root):
        if (model / "config_sentence_transformers.json").is_file():
            return model
    raise CliError(
        f"{given} holds no ColBERT model (no final-model/ and no config_sentence_transformers.json)",
        hint="give a job's output_dir or a PyLate model directory",
    )


@click.command("export-onnx", cls=Command)
@click.argument("model", metavar="MODEL_DIR")
@click.option(
    "--heldout", metavar="BEIR_DIR", help="A BEIR directory whose split measures each form's nDCG@10 against PyTorch."
)
@click.option("--split", default="test", show_default=True, help="The held-out qrels (qrels/SPLIT.tsv).")
@click.option(
    "--max-int8-loss",
    type=click.FloatRange(0, 1),
    help="nDCG@10 int8 may lose before serve --onnx int8 refuses it (default: 0.01).",
)
@click.option("--batch-size", type=click.IntRange(1, 4096), default=32, show_default=True, help="Encoder batch.")
def export_onnx_cmd(model: str, heldout: str | None, split: str, max_int8_loss: float | None, batch_size: int) -> None:
    """Write the model's encoder in ONNX (float32, int8) beside it, with its parity against PyTorch."""
    model_dir = _model_dir(model)
    missing = missing_modules("torch", "pylate", "onnxruntime", "onnx")
    if missing:
        raise CliError(f"export-onnx runs the model here and needs {', '.join(missing)}", hint=_EXTRA)
    from trainer.config.outputs import MAX_INT8_LOSS
    from trainer.config.schema import ConfigError
    from trainer.evaluate import load_beir
    from trainer.onnx_export import ONNX_DIR, export

    try:
        with trainer_log_to_stderr():
            beir = load_beir(heldout, split) if heldout else None
            parity = export(model_dir, beir, MAX_INT8_LOSS if max_int8_loss is None else max_int8_loss, batch_size)
    except ConfigError as e:  # a BEIR directory that is not one, a bad row
        raise CliError(str(e)) from None
    said = (
        f"{model_dir / ONNX_DIR}: largest token error float32 {parity['max_token_error_fp32']:.2g}, "
        f"int8 {parity['max_token_error_int8']:.2g}"
    )
    if "int8_loss" in parity:
        said += (
            f"; nDCG@10 torch {parity['ndcg@10_torch']:.4f}, float32 {parity['ndcg@10_fp32']:.4f}, int8 "
            f"{parity['ndcg@10_int8']:.4f} ({'within' if parity['int8_ok'] else 'more than'} the "
            f"{parity['max_int8_loss']} int8 may lose)"
        )
    else:
        said += "; no --heldout: int8's nDCG@10 is not measured, so serve --onnx int8 needs --allow-int8-loss"
    click.echo(said)
    click.echo(json.dumps(parity, indent=2), err=True)
