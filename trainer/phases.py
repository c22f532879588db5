"""Every phase of a job whole or absent, and the marker that says all of them are.

A job's ``output_dir`` gets, in this order: ``final-model/`` (its ``manifest.json`` last, then renamed into
place), ``metrics.json``, ``index/`` when the config asks for one (manifest last, renamed), ``metrics.json``
again with its ``index`` entry, and ``done.json`` last of all: a manifest of ``metrics.json`` and of the
phases' manifests. All of them are :mod:`trainer.run.checkpoint`'s manifests (size and sha256 of every file,
the format version): one mechanism for checkpoints, models and indexes.

A restart asks :func:`redo_from` which phase to start from. A round of mining whose ``metrics.json``
existed used to count as done, so a kill during the PLAID index build ended in "succeeded" with no index.
Now a final model whose manifest is missing or does not verify is trained again from the round's last
checkpoint, an index is rebuilt, each with one line; the job exits 0 only after :func:`mark_done` has
verified every phase the config asks for. An ``index:`` added to a finished job's config, or ``index.embeddings``
added to its ``index:``, is such a missing phase: the index is built alone, the model is not trained again.

Each phase's figures reach ``metrics.json`` and the model card through :func:`record`, as do those of
``colbert-k8s export-onnx`` run later on the output_dir: for that, :func:`finish` first writes
``job-config.json`` (:func:`record_config`), the config the card is rendered from.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from trainer import labels
from trainer.atomic import replacing, whole_or_absent, write_text
from trainer.config.schema import ConfigError, TrainConfig
from trainer.errors import PhaseNotWhole
from trainer.run.checkpoint import CheckpointError, remove_stale_temporaries, verify, write_manifest
from trainer.storage import card

__all__ = [
    "CONFIG",
    "DONE",
    "finish",
    "mark_done",
    "record",
    "record_config",
    "recorded_config",
    "redo_from",
    "started",
]

log = logging.getLogger("trainer")

DONE = "done.json"  # output_dir's marker: written after every phase is verified whole
CONFIG = "job-config.json"  # output_dir's: the config its card is rendered from, for export-onnx to render it again


def _problem(directory: Path, name: str = "manifest.json") -> str | None:
    """Why ``directory`` is not whole (a manifest of another format included), else None."""
    try:
        return verify(directory, required=True, name=name)
    except CheckpointError as e:
        return str(e)


def redo_from(cfg: TrainConfig) -> tuple[str | None, str]:
    """The first phase of ``cfg``'s job that is not whole in its ``output_dir`` and why: ``train`` (the
    final model or metrics.json), ``index``, ``done`` (only the marker is missing); ``(None, "")`` when
    every phase is whole."""
    out = Path(cfg.output_dir)
    if problem := _problem(out / "final-model"):
        return "train", f"the final model {out / 'final-model'} is not whole: {problem}"
    try:
        metrics = json.loads((out / "metrics.json").read_text())
    except (OSError, ValueError) as e:
        return "train", f"{out / 'metrics.json'} is unreadable ({type(e).__name__})"
    if cfg.index is not None:
        if problem := _problem(out / "index"):
            return "index", f"the index {out / 'index'} is not whole: {problem}"
        if not isinstance(metrics, dict) or "index" not in metrics:
            return "index", f"{out / 'metrics.json'} has no index entry"
        if cfg.index.embeddings and not _has_embeddings(out / "index"):  # asked for since: the index phase again
            return "index", f"the index {out / 'index'} holds no corpus embeddings, which index.embeddings asks for"
    if cfg.vectordb is not None and not (isinstance(metrics, dict) and "vectordb" in metrics):
        return "vectordb", f"{out / 'metrics.json'} has no vectordb entry (the corpus is not in the vector database)"
    if cfg.onnx is not None and not (isinstance(metrics, dict) and "onnx" in metrics):
        return "onnx", f"{out / 'metrics.json'} has no onnx entry (the encoder is not exported to ONNX)"
    if not (out / DONE).is_file():
        return "done", f"{out / DONE} is missing"
    if problem := _problem(out, DONE):
        return "train", f"{out / DONE} does not verify: {problem}"
    return None, ""


def _has_embeddings(index: Path) -> bool:
    from trainer.serve.corpus import EMBEDDINGS  # serve --exact's file, written by the index phase

    return (index / EMBEDDINGS).is_file()


def _onnx(model_dir: Path, cfg: TrainConfig) -> dict:
    """The encoder in ONNX beside the final model, checked on the held-out split when the config has one."""
    from trainer.evaluate import load_beir
    from trainer.onnx_export import export  # torch.onnx and onnxruntime: loaded only when onnx: is asked for

    split = load_beir(cfg.data.eval_beir, cfg.data.eval_split) if cfg.data.eval_beir else None
    return export(model_dir, split, cfg.onnx.max_int8_loss, cfg.evaluation.batch_size)


def _marked(cfg: TrainConfig) -> list[str]:
    return ["metrics.json", "final-model/manifest.json", *(["index/manifest.json"] if cfg.index is not None else [])]


def started(cfg: TrainConfig) -> None:
    """A phase is about to be written again: the old marker goes first, so it never vouches for a mix."""
    (Path(cfg.output_dir) / DONE).unlink(missing_ok=True)


def mark_done(cfg: TrainConfig) -> None:
    """Verify every phase ``cfg`` asks for, then write ``done.json``; raises :class:`PhaseNotWhole` (retryable:
    the restart redoes that phase) when one is not whole."""
    phase, why = redo_from(cfg)
    if phase not in (None, "done"):
        raise PhaseNotWhole(f"{why}; not marking the job done: the restart redoes that phase")
    with whole_or_absent(Path(cfg.output_dir) / DONE) as marker:  # a marker cut short is no marker
        write_manifest(marker.parent, _marked(cfg), name=DONE)


def finish(cfg: TrainConfig, metrics: dict) -> None:
    """Rank 0, once the final model and metrics.json are written: the config the card is rendered from
    (:data:`CONFIG`), the index if asked (metrics.json gains its entry), the corpus into the vector database if
    asked (its entry), the encoder in ONNX if asked (its entry), then the marker. A phase whose entry is there
    already (a restart after it) is not done again."""
    out = Path(cfg.output_dir)
    record_config(cfg)
    index_whole = "index" in metrics and not _problem(out / "index")
    if cfg.index is not None and not (index_whole and (_has_embeddings(out / "index") or not cfg.index.embeddings)):
        from trainer.index import build_and_evaluate  # fast-plaid: loaded only when an index is asked for

        started(cfg)  # a finished job's index built again: its old marker no longer vouches for metrics.json
        remove_stale_temporaries(out)  # a killed build's .tmp-index-*
        metrics["index"] = build_and_evaluate(metrics["model_dir"], cfg)
        if cfg.index.footprint:  # bytes per document against nDCG@10, on the held-out split (six more builds)
            from trainer.footprint import measure

            metrics["footprint"] = measure(Path(metrics["model_dir"]), cfg)
        record(out, cfg, metrics)  # the card shows the figures through the index
    if cfg.vectordb is not None and "vectordb" not in metrics:
        from trainer.vectordb import for_job  # the database's client: loaded only when one is asked for

        metrics["vectordb"] = for_job(metrics["model_dir"], cfg)
        record(out, cfg, metrics)  # the card shows the parity with exact MaxSim
    if cfg.onnx is not None and "onnx" not in metrics:
        metrics["onnx"] = _onnx(Path(metrics["model_dir"]), cfg)
        record(out, cfg, metrics)  # the card shows the parity; the model's manifest lists onnx/
    mark_done(cfg)
    index = f"; PLAID index at {metrics['index']['path']}" if "index" in metrics else ""
    index += f"; corpus in {metrics['vectordb']['destination']}" if "vectordb" in metrics else ""
    log.info("done: model at %s%s", metrics["model_dir"], index)  # last: after the index, not before it


def record(out: Path, cfg: TrainConfig, metrics: dict) -> None:
    """``metrics`` into ``out/metrics.json`` and onto the final model's card, with the model's manifest and the
    marker (where it vouched for the job) following them: all of them, or, when any write fails, all as they
    were. The card is rendered before anything is written."""
    model_dir = out / "final-model"
    files = [model_dir / "README.md", model_dir / "manifest.json", out / "metrics.json", out / DONE]
    before = {path: path.read_bytes() if path.is_file() else None for path in files}
    marked = before[out / DONE] is not None and _problem(out, DONE) is None
    try:
        card.update(model_dir, cfg, metrics)  # the card, then the model's manifest over every file (onnx/ too)
        write_text(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")
        if marked:  # it vouched for the job before: it does for the same files now
            with whole_or_absent(out / DONE):
                write_manifest(out, list(json.loads(before[out / DONE])["files"]), name=DONE)
    except BaseException:
        for path, old in before.items():
            if old is None:
                path.unlink(missing_ok=True)
            else:
                with replacing(path) as tmp:
                    tmp.write_bytes(old)
        raise


def record_config(cfg: TrainConfig) -> None:
    """``output_dir/job-config.json``: ``cfg`` as its card names it, so the card renders the same on any machine
    (``colbert-k8s export-onnx``): each staged source by the URL it came from, the license the card gives, and
    ``loss.temperature: auto`` as the first round's labels chose it. It holds no credentials: the config refuses
    them."""
    update: dict = {
        "model": cfg.model.model_copy(
            update={"name_or_path": card.origin(cfg.model.name_or_path), "license": card.license_of(cfg)}
        )
    }
    update["data"] = cfg.data.model_copy(
        update={"eval_beir": card.origin(cfg.data.eval_beir) if cfg.data.eval_beir else None}
    )
    if cfg.mine is not None and cfg.mine.model:
        update["mine"] = cfg.mine.model_copy(update={"model": card.origin(cfg.mine.model)})
    if getattr(cfg.loss, "temperature", None) == "auto":  # read here, where the job's mined rows are
        try:
            structure = json.loads((Path(cfg.output_dir) / "mined" / "round-1" / labels.FILE).read_text())
            update["loss"] = cfg.loss.model_copy(update={"temperature": labels.temperature_for(structure)})
        except (OSError, ValueError, KeyError):
            pass  # the card says the temperature is not recorded, as the job's own does
    named = cfg.model_copy(update=update).model_dump(mode="json", by_alias=True)
    write_text(Path(cfg.output_dir) / CONFIG, json.dumps(named, indent=2) + "\n")


def recorded_config(out: Path) -> TrainConfig | None:
    """The config the job in ``out`` recorded (:func:`record_config`); None where it recorded none. A damaged
    one is :class:`ConfigError`'s one line."""
    from trainer.config.load import parse_config

    path = out / CONFIG
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"{path} is unreadable ({type(e).__name__}): restart the job to write it again, or remove it"
        ) from None
    return parse_config(data, str(path))
