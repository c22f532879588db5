"""``export-onnx``: a trained model's encoder written in ONNX beside it, checked against PyTorch, for ``serve --onnx``.

    colbert-k8s export-onnx output/ --heldout data/beir --split dev
    colbert-k8s export-onnx path/to/final-model [--max-int8-loss 0.01]

What a job's ``onnx:`` section does after training (``trainer/onnx_export.py``), for a model that exists: a job's
``output_dir`` (its ``final-model/``) or a PyLate model directory. ``onnx/`` is written beside the model's
weights, whole or not at all: ``model.onnx`` (float32), ``model_int8.onnx`` (int8 weights), the tokenizer and
its settings, and ``parity.json``: the largest token-embedding error of each form against the PyTorch model and,
with ``--heldout``, nDCG@10 of each on that split. It runs here and needs the trainer's packages (torch, PyLate,
onnxruntime): ``pip install 'colbert-k8s[train]'``. Importing this module imports none of them.

On a job's output_dir (or its ``final-model/``) the parity is recorded as the job's ``onnx:`` phase records it
(``trainer/phases.py``'s ``record``): ``metrics.json`` gains its ``onnx`` entry, the model card its ONNX section,
the model's manifest lists ``onnx/``, and ``done.json`` follows where it vouched for the job; all of them, or none
(each as it was). The card is rendered from the config the job recorded beside ``metrics.json``
(``job-config.json``); a job that recorded none keeps its card and ``metrics.json``, and one line says so. A
PyLate model directory with no job around it gets ``onnx/`` alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from operator_cli.commands.base import Command, missing_modules, trainer_log_to_stderr
from operator_cli.errors import CliError

if TYPE_CHECKING:
    from trainer.config.schema import TrainConfig

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


def _job_around(model_dir: Path) -> Path | None:
    """The job's output_dir whose final model ``model_dir`` is (a ``metrics.json`` beside it), else None."""
    out = model_dir.parent
    return out if model_dir.name == "final-model" and (out / "metrics.json").is_file() else None


def _job(out: Path) -> tuple[dict, TrainConfig | None]:
    """The job's ``metrics.json`` and recorded config (None: it recorded none), read before anything is written;
    one line if either is damaged or the final model is not whole (its manifest would vouch for it again)."""
    from trainer.config.schema import ConfigError
    from trainer.phases import recorded_config
    from trainer.run.checkpoint import CheckpointError, verify

    try:
        metrics = json.loads((out / "metrics.json").read_text())
    except ValueError as e:
        raise CliError(f"{out / 'metrics.json'} is not JSON ({e})", hint="restart the job to write it again") from None
    if not isinstance(metrics, dict):
        raise CliError(f"{out / 'metrics.json'} is not a JSON object", hint="restart the job to write it again")
    try:
        cfg = recorded_config(out)
        problem = verify(out / "final-model") if cfg is not None else None
    except (ConfigError, CheckpointError) as e:
        raise CliError(str(e)) from None
    if problem:
        raise CliError(
            f"the final model {out / 'final-model'} is not whole: {problem}",
            hint="restart the job, which saves it again, then export it",
        )
    return metrics, cfg


def _record(out: Path, cfg: TrainConfig | None, metrics: dict, parity: dict) -> None:
    """The parity into ``metrics.json`` and onto the card, as the job's ``onnx:`` phase records it."""
    from trainer.config.schema import ConfigError
    from trainer.errors import JobVerdict
    from trainer.phases import CONFIG, record

    if cfg is None:
        click.echo(
            f"{out}: no {CONFIG} (a job of an earlier colbert-k8s records none): the card and metrics.json are not "
            "updated; onnx/parity.json holds the figures",
            err=True,
        )
        return
    try:
        record(out, cfg, {**metrics, "onnx": parity})
    except (ConfigError, JobVerdict, OSError) as e:
        raise CliError(
            f"onnx/ is written, but the card and metrics.json are not updated and are as they were: {e}",
            hint="free the space or fix the path it names, then run export-onnx again",
        ) from None


@click.command("export-onnx", cls=Command)
@click.argument("model", metavar="MODEL_DIR")
@click.option(
    "--heldout", metavar="BEIR_DIR", help="A BEIR directory whose split measures each form's nDCG@10 against PyTorch."
)
@click.option("--split", default="test", show_default=True, help="The held-out qrels (qrels/SPLIT.tsv).")
@click.option(
    "--max-int8-loss",
    type=click.FloatRange(0, 1),
    help="nDCG@10 int8 may lose before serve --onnx int8 refuses it (default: the job's onnx: value, else 0.01).",
)
@click.option("--batch-size", type=click.IntRange(1, 4096), default=32, show_default=True, help="Encoder batch.")
def export_onnx_cmd(model: str, heldout: str | None, split: str, max_int8_loss: float | None, batch_size: int) -> None:
    """Write the model's encoder in ONNX (float32, int8) beside it, with its parity against PyTorch."""
    model_dir = _model_dir(model)
    missing = missing_modules("torch", "pylate", "onnxruntime", "onnx")
    if missing:
        raise CliError(f"export-onnx runs the model here and needs {', '.join(missing)}", hint=_EXTRA)
    out = _job_around(model_dir)
    metrics, cfg = _job(out) if out is not None else ({}, None)
    from trainer.config.outputs import MAX_INT8_LOSS
    from trainer.config.schema import ConfigError
    from trainer.evaluate import load_beir
    from trainer.onnx_export import ONNX_DIR, export

    try:
        with trainer_log_to_stderr():
            beir = load_beir(heldout, split) if heldout else None
            margin = cfg.onnx.max_int8_loss if cfg is not None and cfg.onnx is not None else MAX_INT8_LOSS
            parity = export(model_dir, beir, margin if max_int8_loss is None else max_int8_loss, batch_size)
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
    if out is None:
        click.echo(f"{model_dir}: the card is not updated: there is no job output around the model", err=True)
    else:
        _record(out, cfg, metrics, parity)
