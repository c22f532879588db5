"""A job of mining rounds: mine hard negatives, train, and again with the model just trained.

round 1: mine with ``mine.retriever``: BM25, or ``mine.model`` (default: the base model) -> train the base
round r: mine with round r-1's final model -> train ``model.name_or_path`` again on the new rows

Each round trains from the base model, so a round's gain comes from its negatives alone (the recipe behind
ColBERTv2's later rounds); mining stays split-invariant and resumable in every round. Rounds before the last
write to ``output_dir/rounds/round-R``; the last one to ``output_dir`` itself, so the final model and
``metrics.json`` are where a job without mining puts them. Mined rows go to
``output_dir/mined/round-R/``. A round whose phases all verify (``trainer/phases.py``: the final model, the
index if asked, ``metrics.json``, ``done.json``) is done; a restarted job skips it, builds a missing index
again, and resumes the first unfinished round from its own checkpoints. A job without mining is one such
round: restarted after its training was whole (killed during the index build or the export), it does not
train again.

One process group spans every round (``distributed.process_group`` is a no-op inside it), and so do
one progress (trainer/reporting/progress.py: every round's mining and training are phases of it, 100% only at the
very end), one peer watchdog (trainer/run/watchdog.py: a peer frozen while mining is noticed as fast as
one frozen while training) and one SIGTERM flag (trainer/run/preemption.py): honoured at a training step, after
a mined part, and here before each next phase (a round, its training, its index, the export), so a SIGTERM
that comes between phases stops the job with 143 as one during a step does, and the restart resumes there.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from trainer import distributed as D
from trainer import labels, phases, query_length, train
from trainer.baseline import BelowBase, check_not_below_base
from trainer.config.schema import ConfigError, TrainConfig
from trainer.data import DataError
from trainer.env import Layout
from trainer.mine import (
    LABELS,
    MiningError,
    changed_inputs,
    load_pairs,
    mine,
    mined_source,
    mining_fingerprint,
)
from trainer.model import build_model
from trainer.reporting.progress import Phase, Progress, job_plan, with_export
from trainer.retrieval import RETRIEVERS
from trainer.retrieval.search import DOC_CHUNK
from trainer.run.checkpoint import list_checkpoints
from trainer.run.preemption import StopRequest
from trainer.run.watchdog import watching
from trainer.storage import export

__all__ = ["round_config", "run"]

log = logging.getLogger("trainer")


def run(cfg: TrainConfig, layout: Layout, metrics_file: str | None = None) -> dict:
    """Train as ``cfg`` says: plainly, or in ``mine.rounds`` rounds of mining and training. ``metrics_file``:
    ``--metrics-file``, to which every round's periodic evaluations are appended (trainer/reporting/metrics_file.py)."""
    cfg, why = query_length.resolved(cfg)  # model.query_length: auto, from the training queries (same on every rank)
    chosen = {"query_length": why} if why else {}
    if why and layout.is_main:
        log.info("%s", why)
    with (
        D.process_group(layout, cfg.distributed.timeout_seconds),
        watching(layout.distributed, layout.rank, layout.world_size, cfg.distributed.peer_timeout_seconds),
        StopRequest() as stop,
    ):
        progress = Progress(plan=_plan(cfg, layout), enabled=layout.is_main)
        if cfg.mine is None:  # one round without mining: restarted after it (in the export), it does not train
            metrics = {}
            if _trained_before(cfg, layout, "the job"):
                progress.skip("train")
            else:
                metrics = _train(
                    cfg, layout, stop, "the job", progress=progress, metrics_file=metrics_file, chosen=chosen
                )
        else:
            metrics = _rounds(cfg, layout, progress, stop, metrics_file, chosen)
        if not metrics and layout.is_main:  # done before: report its figures
            metrics = json.loads((Path(cfg.output_dir) / "metrics.json").read_text())
        if cfg.export is not None:
            stop.honour("before the export")
        _export(cfg, layout, progress, metrics)
        if stop.requested:  # it came during the last phase, which finished: nothing is left to resume
            log.info("SIGTERM came during the job's last phase, which finished: the job is whole")
        progress.close()  # the 100%, once, at the very end
    return metrics


def _rounds(
    cfg: TrainConfig, layout: Layout, progress: Progress, stop: StopRequest, metrics_file: str | None, chosen: dict
) -> dict:
    """Each round: mine with the previous round's model (the first: ``mine.retriever``/``mine.model``), train."""
    device = D.device_for(layout)
    metrics: dict = {}
    previous: Path | None = None
    for r in range(1, cfg.mine.rounds + 1):
        rcfg = round_config(cfg, r)
        out = Path(rcfg.output_dir)
        progress.round = r
        what = f"round {r}/{cfg.mine.rounds}"
        stop.honour(f"before {what}")
        if _trained_before(rcfg, layout, what):
            progress.skip()  # the index is not counted (reporting/progress.py)
        else:
            log.info(
                "round %d/%d: mining with %s", r, cfg.mine.rounds, previous or cfg.mine.model or cfg.mine.retriever
            )
            load = lambda prev=previous: _mining_model(cfg, layout, device, prev)  # loaded only if needed
            source = f"round {r}: {previous}" if previous else cfg.mine.model or cfg.mine.retriever
            mined_dir = Path(cfg.output_dir) / "mined" / f"round-{r}"
            _refuse_new_rows_under_checkpoints(cfg, layout, mined_dir, out / "checkpoints", source)
            mined = mine(cfg, layout, mined_dir, load, source, progress, stop)
            stop.honour(f"after {what}'s mining, before its training")
            rcfg = rcfg.model_copy(
                update={"data": rcfg.data.model_copy(update={"train": mined_source(mined, cfg.loss.scored)})}
            )
            rcfg = _resolved_temperature(rcfg, layout, Path(cfg.output_dir) / "mined" / "round-1")
            pairs = cfg.data.train.pairs()
            metrics = _train(rcfg, layout, stop, what, pairs, progress, metrics_file=metrics_file, chosen=chosen)
        previous = out / "final-model"
    return metrics


def _resolved_temperature(cfg: TrainConfig, layout: Layout, mined: Path) -> TrainConfig:
    """``cfg`` with ``loss.temperature: auto`` replaced by the value the labels' structure gives (trainer/labels.py),
    as the first round's retriever saw it (every round alike); rank 0 reads it, since only its pod may hold it."""
    if getattr(cfg.loss, "temperature", None) != "auto":
        return cfg
    structure, problem = None, None
    if layout.is_main:
        try:
            structure = json.loads((mined / LABELS).read_text())
        except (OSError, ValueError) as e:
            problem = (
                f"loss.temperature: auto reads {mined / LABELS}, which the mining of these rows did not write "
                f"({type(e).__name__}); use a new output_dir to mine again, or set loss.temperature to a number"
            )
    structure, problem = D.broadcast_object((structure, problem))
    if problem:
        raise MiningError(problem)
    if layout.is_main:
        log.info("loss: %s", labels.explain(structure))
    return cfg.model_copy(
        update={"loss": cfg.loss.model_copy(update={"temperature": labels.temperature_for(structure)})}
    )


def _train(cfg: TrainConfig, layout: Layout, stop: StopRequest, what: str, *args, **kwargs) -> dict:
    """The training phase (trainer/train.py), then rank 0's: the index when ``cfg`` asks for one, and the marker
    (trainer/phases.py). The other ranks go on to the next phase and meet rank 0 at its first collective."""
    metrics = train.run(cfg, layout, *args, stop=stop, **kwargs)
    stop.honour(f"after {what}'s training (its final model is saved)")
    if layout.is_main:
        phases.finish(cfg, metrics)  # the index if asked (and its figures on the card), then done.json
    return metrics


def _export(cfg: TrainConfig, layout: Layout, progress: Progress, metrics: dict) -> None:
    """Rank 0 exports (trainer/storage/export.py) once every phase is whole, then registers it when ``register:`` asks
    (trainer/serve/register.py); every rank raises its failure together. A model below the base model as it
    ships is neither (trainer/baseline.py): that verdict is permanent, an export failure is retryable."""
    if cfg.export is None:
        return
    problem, below = None, None
    if layout.is_main:
        try:
            check_not_below_base(metrics, cfg.evaluation.metric, cfg.export.allow_regression)
        except BelowBase as e:
            below = str(e)
    if below := D.broadcast_object(below):
        raise BelowBase(below)
    if layout.is_main:
        try:
            export.run(cfg, progress)
            if cfg.registration is not None:  # after the verified export, once (registered.json)
                from trainer.serve.register import after_export

                after_export(cfg)
        except export.ExportFailed as e:  # RegisterFailed too: retryable, the restart registers once
            problem = str(e)
        except Exception as e:  # whatever it was, the other ranks must not wait for rank 0 in vain
            problem = f"export to {cfg.export.destination} failed ({type(e).__name__}: {str(e)[:200]})"
    if problem := D.broadcast_object(problem):
        raise export.ExportFailed(problem)


def _trained_before(cfg: TrainConfig, layout: Layout, what: str) -> bool:
    """Whether ``cfg``'s training (a round's, or a plain job's) was done by an earlier start: then the later
    phases that are not whole (the index, the marker) are done now, on rank 0, and True. Rank 0 decides for
    every rank (per-pod storage: only its pod holds output_dir). Whole, not merely begun: metrics.json alone
    said "done" while the index was never built (trainer/phases.py)."""
    out = Path(cfg.output_dir)
    phase, why = D.broadcast_object(phases.redo_from(cfg) if layout.is_main else None)
    if phase is None:
        again = "not trained again, and config changes since are not applied; to train again, use a new output_dir"
        log.info("%s: done before (%s verifies): %s", what, (out / phases.DONE).absolute(), again)  # where it is
    elif phase in ("index", "vectordb", "onnx", "done"):
        then = {
            "index": "building the index again",
            "vectordb": "writing the corpus into the vector database",
            "onnx": "exporting the encoder to ONNX",
        }
        log.warning("%s: trained before, but %s: %s", what, why, then.get(phase, "the rest verified, marking it done"))
        if layout.is_main and phase in then:
            phases.finish(cfg, json.loads((out / "metrics.json").read_text()))
        elif layout.is_main:
            phases.mark_done(cfg)
    else:
        if (out / "metrics.json").is_file() or (out / "final-model").is_dir():
            log.warning("%s: %s; training it again from its last checkpoint", what, why)
        return False
    return True


def _plan(cfg: TrainConfig, layout: Layout) -> list:
    """Rank 0's estimate of the job's phases (trainer/reporting/progress.py), from data.train and the corpus; a
    problem with them is left for mining to name in one line on every rank, and the plan is then a guess."""
    if not layout.is_main:
        return []
    if cfg.mine is None:  # training corrects its step count when it builds its data
        return job_plan(cfg, layout.world_size, rows=0, queries=0, documents=0, chunk=1)
    try:
        pairs = load_pairs(cfg)
        return job_plan(cfg, layout.world_size, len(pairs.rows), len(pairs.queries), len(pairs.corpus), DOC_CHUNK)
    except ConfigError:  # DataError included: raised again where every rank meets it
        rounds = range(1, cfg.mine.rounds + 1)
        guess = [Phase(r, "train", f"round {r}/{cfg.mine.rounds}: train", 1, 1.0) for r in rounds]
        return with_export(cfg, guess)


def _refuse_new_rows_under_checkpoints(cfg: TrainConfig, layout: Layout, mined: Path, checkpoints: Path, source: str):
    """A round with training checkpoints whose mining inputs changed (mine.negatives 2 -> 3) would mine new
    rows and resume training on them: refused before any mining, in one line, on every rank alike."""
    problem = None
    if layout.is_main and cfg.checkpoint.resume and list_checkpoints(checkpoints):
        try:
            what = changed_inputs(mined, mining_fingerprint(cfg, source))
        except DataError:
            what = None  # mine() names a data problem itself
        if what:
            problem = (
                f"the mining inputs changed ({what}) but {checkpoints} holds training checkpoints made from the "
                "rows mined before; use a new output_dir for the new settings, or set them back to resume"
            )
    if problem := D.broadcast_object(problem):
        raise MiningError(problem)


def round_config(cfg: TrainConfig, r: int) -> TrainConfig:
    """Round ``r``'s training config: its output directory; the index and the evaluation before
    training only where they add something (the last round; the first, whose base model they share)."""
    last = r == cfg.mine.rounds
    return cfg.model_copy(
        update={
            "output_dir": cfg.output_dir if last else str(Path(cfg.output_dir) / "rounds" / f"round-{r}"),
            "index": cfg.index if last else None,
            "evaluation": cfg.evaluation.model_copy(
                update={"before_training": cfg.evaluation.before_training and r == 1}
            ),
        }
    )


def _mining_model(cfg: TrainConfig, layout: Layout, device: torch.device, previous: Path | None):
    """None for BM25; else the base model (or ``mine.model``), with the previous round's weights when
    there is one.

    Rank 0 reads those weights and broadcasts them, since with per-pod storage only its pod has them.
    ``mine.model``, like ``model.name_or_path``, is read by every pod from where the user put it."""
    first = RETRIEVERS[cfg.mine.retriever]
    if previous is None and not first.needs_model:
        return None
    if previous is None and first.uses == "dense":  # the base model's own pooling, not a ColBERT
        from trainer.retrieval.dense import load_bi_encoder

        return load_bi_encoder(cfg.mine.model or cfg.model.name_or_path, device)
    torch.manual_seed(cfg.training.seed)  # the same new projection layer as training builds
    if previous is None and cfg.mine.model:
        path, key = cfg.mine.model, "mine.model"
    else:
        path, key = cfg.model.name_or_path, "model.name_or_path"
    model = build_model(cfg.model.model_copy(update={"name_or_path": path}), device, key)
    if previous is not None:
        model.load_state_dict(_trained_weights(cfg, layout, previous))
    return model


def _trained_weights(cfg: TrainConfig, layout: Layout, previous: Path | None) -> dict | None:
    """The previous round's final weights on every rank (None in the first round): rank 0 reads them and
    broadcasts them, since with per-pod storage only its pod has them."""
    if previous is None:
        return None
    state = None
    if layout.is_main:
        state = build_model(cfg.model.model_copy(update={"name_or_path": str(previous)}), "cpu").state_dict()
    return D.broadcast_object(state)
