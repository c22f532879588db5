"""The training run on one rank, top to bottom.

process group -> build (model under DDP, data, loss, optimizer, schedule, precision) -> resume ->
evaluate before -> loop (step, log, evaluate every N, checkpoint every N and on SIGTERM) ->
evaluate after -> final model + metrics.json -> teardown.

``trainer/cli.py`` reads the config and stages the data; ``trainer/rounds.py`` calls :func:`run` in every
process, once per round, and runs the phases after it (the PLAID index, done.json: trainer/phases.py).
Every phase below takes the run's state ``t`` alone (``trainer/run/state.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import resource
import time
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from trainer import distributed as D
from trainer import grad_sync, phases
from trainer.atomic import replace_dir, whole_or_absent, write_text
from trainer.baseline import figures, measure_base
from trainer.config.schema import DataSource, TrainConfig
from trainer.data import Rows, load_rows
from trainer.data.batches import StreamingData, TokenizedData, batches
from trainer.env import Layout
from trainer.errors import NO_SPACE, DiskFull
from trainer.evaluate import evaluate, load_beir
from trainer.losses import build_loss
from trainer.losses.hardness import STALE_SHARE, summarize
from trainer.model import autocast_for, build_model, choose_precision
from trainer.optim import ENCODER_GROUPS, param_groups, schedule
from trainer.projection import SAMPLE_DOCUMENTS, first_documents, start_projection
from trainer.reporting.metrics_file import append_line
from trainer.reporting.progress import Progress
from trainer.reporting.tracking import Tracker
from trainer.run import resume
from trainer.run.checkpoint import remove_stale_temporaries, write_manifest
from trainer.run.clock import PROCESS_STARTED
from trainer.run.preemption import Preempted, StopRequest
from trainer.run.state import TrainState
from trainer.run.watchdog import watching
from trainer.scale import job_scale
from trainer.step import optimizer_step
from trainer.storage.card import for_job, origin

__all__ = ["run", "build"]

log = logging.getLogger("trainer")


def run(
    cfg: TrainConfig,
    layout: Layout,
    labelled_from: DataSource | None = None,
    progress: Progress | None = None,
    metrics_file: str | None = None,
    stop: StopRequest | None = None,
    chosen: dict[str, str] | None = None,
) -> dict:
    """Train on this rank; returns the final metrics (identical on every rank) once the final model and
    metrics.json are written. ``labelled_from``: the user's (query, positive) pairs when data.train is rows
    mined from them, so that the card names the user's data, not the mined copy (default: data.train itself).
    ``progress``: the job's, when training is one of its phases. ``metrics_file``: where each periodic evaluation
    is appended as it happens (a sweep's early stopping). ``stop``: the job's SIGTERM flag
    (trainer/run/preemption.py); without one, training installs its own. ``chosen``: what the job's ``auto``
    settings chose and why (trainer/query_length.py), for metrics.json and the card."""
    device = D.device_for(layout)
    with (
        D.process_group(layout, cfg.distributed.timeout_seconds),
        watching(layout.distributed, layout.rank, layout.world_size, cfg.distributed.peer_timeout_seconds),
        contextlib.nullcontext(stop) if stop is not None else StopRequest() as stop,
        _tracker(cfg, layout) as tracker,
    ):
        t = build(cfg, layout, device, labelled_from)
        if chosen:
            t.metrics["auto"] = dict(chosen)
        t.stop, t.tracker, t.metrics_file = stop, tracker, metrics_file
        _resume(t)
        t.progress = (progress or Progress(enabled=layout.is_main)).train(t.total_steps, t.step)  # status + log line
        _evaluate_before(t)
        elapsed, steps = _loop(t)
        _record_speed(t, elapsed, steps)
        _finish(t, elapsed)
    return t.metrics


# ---- set-up ---------------------------------------------------------------------------------------


def build(
    cfg: TrainConfig,
    layout: Layout,
    device: torch.device,
    labelled_from: DataSource | None = None,
) -> TrainState:
    """Model (the same initial weights everywhere), data, loss, optimizer, schedule, precision."""
    tcfg = cfg.training
    random.seed(tcfg.seed + layout.rank)
    torch.manual_seed(tcfg.seed)  # the same new projection layer on every rank
    rows = load_rows(cfg.data.train, distillation=cfg.loss.scored, cache_dir=cfg.data.cache_dir)
    model = starting_model(cfg, rows, device)
    forward = grad_sync.wrap(model, device, cfg.distributed.find_unused_parameters)  # DDP: rank 0's weights
    torch.manual_seed(tcfg.seed + layout.rank)  # a different dropout stream per rank

    scale = job_scale(cfg, layout.world_size)  # per-device batch and accumulation for this world size
    kind = TokenizedData if cfg.data.pretokenize else StreamingData
    # accumulation: A micro-batches per rank and step are A x W "virtual ranks" of one global batch
    virtual_ranks = layout.world_size * scale.accumulation
    data = kind(rows, model, scale.per_device, virtual_ranks, tcfg.seed)
    scale = replace(scale, docs_per_query=data.docs_per_query)  # as a step takes them (plain pairs: 1), for the log
    total_steps = data.total_steps(tcfg.epochs, tcfg.max_steps)
    log.info("scale: %s", scale.line())
    log.info(
        "steps=%d (%d/epoch) mode=%s master=%s:%s",
        total_steps,
        data.steps_per_epoch,
        layout.mode,
        layout.master_addr,
        layout.master_port,
    )

    optimizer = torch.optim.AdamW(param_groups(model, tcfg), lr=tcfg.learning_rate, fused=device.type == "cuda")
    precision = choose_precision(tcfg.precision, device)
    log.info("precision %s on %s", precision, device)
    return TrainState(
        cfg=cfg,
        layout=layout,
        device=device,
        model=model,
        forward=forward,
        params=[p for p in model.parameters() if p.requires_grad],
        optimizer=optimizer,
        scheduler=schedule(tcfg, optimizer, total_steps),
        scaler=torch.amp.GradScaler(device.type, enabled=precision == "fp16"),  # scale() is a no-op when off
        autocast=autocast_for(precision, device),
        data=data,
        loss_fn=build_loss(cfg.loss, gather=scale.gather),
        total_steps=total_steps,
        accumulation=scale.accumulation,
        max_grad_norm=tcfg.max_grad_norm,
        skip_nonfinite=tcfg.skip_nonfinite_steps,
        data_identity=rows.identity(),  # once: checked on resume, saved with every checkpoint
        data_sampled=rows.sampled_identity(),
        metrics={
            "world_size": layout.world_size,
            "global_batch": scale.global_batch,
            "loss": cfg.loss.name,
            "precision": precision,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
            "train_data": origin((labelled_from or cfg.data.train).path),  # the user's, not the mined rows' copy
        },
    )


def starting_model(cfg: TrainConfig, rows: Rows, device: torch.device) -> torch.nn.Module:
    """The weights every rank starts from: the base model with its projection started as configured; then TF32
    and compilation as the config asks."""
    model = build_model(cfg.model, device)
    if cfg.model.projection_init == "principal":  # a checkpoint found on resume still replaces it
        start_projection(model, cfg.model, first_documents(rows, SAMPLE_DOCUMENTS))
    if device.type == "cuda":  # TF32 matmuls: Ampere or newer (others ignore it)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = cfg.training.tf32
    if cfg.training.compile:
        model[0].auto_model.compile()  # in place: the state dict keeps its names, checkpoints stay loadable
    return model


@contextlib.contextmanager
def _tracker(cfg: TrainConfig, layout: Layout):
    """metrics.jsonl, TensorBoard, MLflow, W&B on rank 0 (see reporting/tracking.py); closed on every exit path."""
    name = cfg.tracking.run_name or Path(cfg.output_dir).name
    tracker = Tracker(cfg.tracking.report_to, cfg.output_dir, name, cfg.model_dump(mode="json"), layout.is_main)
    try:
        yield tracker
    finally:
        tracker.close()


def _resume(t: TrainState) -> None:
    """Rank 0 decides for the whole job; every rank restores the same state, then the weights are compared.

    The checkpoint's RNG streams are kept in ``t.rng`` and set by the loop right before the next step."""
    cfg, layout = t.cfg, t.layout
    if layout.is_main:
        remove_stale_temporaries(t.out_dir)
        phases.started(cfg)  # the final model and metrics.json are written again: no marker vouches for a mix
    found = resume.load_for_job(t.ckpt_dir, cfg, layout.world_size, t.data_identity, t.data_sampled)
    if found:
        path, state = found
        written_by, saved_config = state.get("world_size"), state.get("config", {})
        resume.restore(t, path, state)
        if written_by != layout.world_size:  # an elastic resume: the data position and the mathematics carry over
            t.rng = resume.derived_rng(cfg.training.seed, t.step, layout.rank, t.device)
            log.info(
                "world size %s -> %d at step %d (training.global_batch_size %d): the same batches, RNG "
                "streams derived from (seed, step, rank)",
                written_by,
                layout.world_size,
                t.step,
                cfg.training.global_batch_size,
            )
        log.info("resumed from %s at step %d/%d", path, t.step, t.total_steps)
        for change in resume.apply_changed_hyperparameters(saved_config, cfg, t.optimizer, t.scheduler):
            log.info("changed since the checkpoint, applied from step %d: %s", t.step + 1, change)
        del state, found
    resume.check_same_weights(t.model, f"at step {t.step} after start-up")


# ---- the loop -------------------------------------------------------------------------------------


def _evaluate_before(t: TrainState) -> None:
    """The untrained ColBERT ("before") and the base model as it ships ("base", trainer/baseline.py), at step 0;
    a ColBERT base is its own start, so its "base" is the "before" figures."""
    cfg = t.cfg
    t.split = load_beir(cfg.data.eval_beir, cfg.data.eval_split) if cfg.data.eval_beir else None
    if not t.split or t.step > 0:
        return
    base, kind = measure_base(cfg, t.split, t.device, t.layout.is_main)
    if cfg.evaluation.before_training or kind == "colbert":
        t.metrics["before"] = _evaluate(t, "before training")
    if base or kind == "colbert":
        t.metrics["base"] = base or t.metrics["before"]


def _loop(t: TrainState) -> tuple[float, int]:
    """Optimizer steps until ``total_steps``; logs, evaluates and checkpoints every N steps and on SIGTERM.

    Returns (seconds in the loop, steps it took). The loss stays on the device; it is read back at log
    steps only (a host sync), and once a step the stop flag is, from the all-reduce that carries both."""
    cfg, layout = t.cfg, t.layout
    t.model.train()
    started, first_step = time.perf_counter(), t.step
    bar = tqdm(total=t.total_steps, initial=t.step, desc="train", disable=not layout.is_main, dynamic_ncols=True)
    feed = batches(
        t.data, t.step, t.total_steps, layout.rank, t.device, cfg.data.num_workers, layout.world_size, t.accumulation
    )
    every_eval, every_ckpt, log_every = cfg.evaluation.every_steps, cfg.checkpoint.every_steps, cfg.training.log_every
    # on every way out of the loop, errors included, its workers end and the bar is closed (its line ends, so
    # the error's one line starts its own); a log line clears the bar first (tqdm's redirect), so the two
    # never share a line in a pod's log
    with contextlib.closing(feed), logging_redirect_tqdm(), bar:
        if t.rng is not None:  # the last thing before the step: the next draw is the step's own dropout
            resume.set_rng(t.rng, t.device)
            t.rng = None
        while t.step < t.total_steps:
            local_loss, grad_norm = optimizer_step(t, feed)
            # the global-batch mean (comparable across world sizes), and whether any pod got SIGTERM
            t.loss, stopping = D.mean_and_any(local_loss, t.stop.requested, t.device)
            _note_time(t)
            if t.step % log_every == 0 or t.step == t.total_steps:
                bar.set_postfix(loss=f"{_report(t, grad_norm):.4f}", refresh=False)
            bar.update(1)
            if stopping:
                if t.step > first_step:
                    _checkpoint(t)
                raise Preempted.at_step(t.step)
            if t.split and every_eval and t.step % every_eval == 0 and t.step < t.total_steps:
                _keep_if_best(t, _report_intermediate(t, _evaluate(t, f"at step {t.step}")))
            if t.step % every_ckpt == 0 and t.step < t.total_steps:
                _checkpoint(t)
    return time.perf_counter() - started, t.step - first_step


def _evaluate(t: TrainState, when: str) -> dict:
    """Every rank evaluates its shard of the corpus; rank 0 logs and reports the (shared) result."""
    result = evaluate(t.model, t.split, t.cfg.evaluation.batch_size)
    if t.layout.is_main:
        log.info("eval %s: %s", when, figures(result))
    t.tracker.log(t.step, result, prefix="eval/")
    if t.progress is not None:  # None only where a test drives the phases without run()
        t.progress.evaluated(t.step, t.cfg.evaluation.metric, result)
    return result


def _report_intermediate(t: TrainState, result: dict) -> dict:
    """Rank 0 appends a periodic evaluation to ``--metrics-file``: the intermediate values a sweep's median
    stop compares (trainer/reporting/metrics_file.py). The final one is appended by the CLI once the job is whole."""
    if t.metrics_file and t.layout.is_main:
        append_line(t.metrics_file, result, t.step)
    return result


def _note_time(t: TrainState) -> None:
    t.step_times.append(time.perf_counter())
    if len(t.step_times) == 1:
        t.metrics["first_step_seconds"] = round(time.time() - PROCESS_STARTED, 2)
        log.info("first optimizer step %.1fs after the process started", t.metrics["first_step_seconds"])


def _report(t: TrainState, grad_norm: float) -> float:
    """Log and track the step; returns the loss, read back from the device here (a host sync)."""
    loss, lrs = float(t.loss), t.scheduler.get_last_lr()
    lr, head = lrs[0], {"head_lr": lrs[-1]} if len(lrs) > ENCODER_GROUPS else {}  # the projection's own rate
    hard = _hardness(t)
    shown = f" head_lr {head['head_lr']:.2e}" if head else ""
    shown += f" margin {hard['margin']:.3f} easy {100 * hard['easy_share']:.0f}%" if hard else ""
    log.info("step %d/%d loss %.4f grad_norm %.3f lr %.2e%s", t.step, t.total_steps, loss, grad_norm, lr, shown)
    recent = t.step_times[-11:]
    speed = (len(recent) - 1) * t.data.global_batch / (recent[-1] - recent[0]) if len(recent) > 1 else 0.0
    figures = {"loss": loss, "lr": lr, **head, "grad_norm": grad_norm, "samples_per_second": speed, **hard}
    t.tracker.log(t.step, figures, "train/")
    t.progress.step(t.step, loss, lr, speed, hard)
    return loss


def _hardness(t: TrainState) -> dict[str, float]:
    """The negatives' hardness since the last log step, over every rank (losses/hardness.py); kept in
    ``metrics.json`` at every log step (``curve``) and as first and last seen, for the card; one warning the
    first time most rows are easy."""
    if t.hardness is None:  # a loss that does not measure it: the same on every rank, so no collective
        return {}
    hard = summarize(D.sum_across(t.hardness).tolist())
    t.hardness = None
    if not hard:
        return {}
    seen = t.metrics.setdefault("hardness", {})
    seen.setdefault("first", {"step": t.step, **hard})
    seen["last"] = {"step": t.step, **hard}
    seen.setdefault("curve", []).append({"step": t.step, **{k: round(v, 4) for k, v in hard.items()}})
    if hard["easy_share"] > STALE_SHARE and "stale_at" not in seen:
        seen["stale_at"] = t.step
        if t.layout.is_main:
            log.warning(
                "step %d: %.0f%% of rows have a near-zero loss (the positive beats the hardest negative by %.2f): "
                "the negatives have gone stale and teach little; mine again with the trained model "
                "(mine.rounds: 2) or from a stronger retriever (mine.retriever: dense)",
                t.step,
                100 * hard["easy_share"],
                hard["margin"],
            )
    return hard


def _keep_if_best(t: TrainState, result: dict) -> None:
    """Save ``best-model`` when the chosen metric improved; the best so far travels in checkpoints."""
    metric = t.cfg.evaluation.metric
    best = t.metrics.get("best")
    if best is not None and result[metric] <= best[metric]:
        return
    t.metrics["best"] = {"step": t.step, **result}

    def save() -> None:
        if t.layout.is_main:
            path = _save_model(t.model, t.out_dir, "best-model")
            log.info("best %s so far (%.4f at step %d): saved %s", metric, result[metric], t.step, path)

    _on_every_rank(save)  # a full disk stops every rank with its line, not rank 0 alone


def _checkpoint(t: TrainState) -> None:
    resume.check_same_weights(t.model, f"at step {t.step}")
    state = resume.capture(t)
    _on_every_rank(lambda: resume.save(t.ckpt_dir, state, t.cfg.checkpoint.keep_last))


def _on_every_rank(write) -> None:
    """Rank 0's write (the others pass None to save), its full-disk verdict raised on every rank together:
    raised on rank 0 alone, the others went on into the next step's collectives and the job hung."""
    problem = None
    try:
        write()
    except DiskFull as e:
        problem = str(e)
    except OSError as e:
        if e.errno not in NO_SPACE:
            raise
        problem = str(DiskFull.of(e, e.filename or "."))
    if problem := D.broadcast_object(problem):
        raise DiskFull(problem)


# ---- the end --------------------------------------------------------------------------------------


def _record_speed(t: TrainState, elapsed: float, done: int) -> None:
    """Samples/s is global samples (steps x global batch) over the loop's own time, counted here."""
    times, device = t.step_times, t.device
    steady = (len(times) - 3) * t.data.global_batch / (times[-1] - times[2]) if len(times) > 3 else None
    t.metrics.update(
        peak_rss_mb=D.gather_floats(_peak_rss_mb(), device),
        worker_peak_rss_mb=D.gather_floats(_peak_rss_mb(children=True), device),
        steps=t.step,
        skipped_nonfinite_steps=t.skipped_nonfinite,
        final_loss=float(t.loss) if done else None,
        train_seconds=round(elapsed, 2),
        samples_per_second=round(done * t.data.global_batch / elapsed, 2) if done else None,
        steady_samples_per_second=round(steady, 2) if steady else None,  # after the first 3 steps
        peak_gpu_memory_mb=round(torch.cuda.max_memory_allocated(device) / 2**20, 1) if device.type == "cuda" else None,
    )
    if t.scaler.is_enabled():  # fp16: the steps GradScaler skipped (trainer/step.py), and where its scale ended
        t.metrics.update(scaler_skipped_steps=t.metrics.get("scaler_skipped_steps", 0), loss_scale=t.scaler.get_scale())


def _finish(t: TrainState, elapsed: float) -> None:
    """All ranks evaluate; rank 0 saves the final model atomically and writes metrics.json."""
    resume.check_same_weights(t.model, "at the end")  # no final model of non-finite or diverged weights
    cfg = t.cfg
    if t.split and cfg.evaluation.after_training:
        t.metrics["after"] = _evaluate(t, "after training")
        if cfg.evaluation.every_steps:
            _keep_if_best(t, t.metrics["after"])

    def save() -> None:
        if t.layout.is_main:
            card = for_job(cfg, t.metrics)
            # as output_dir gives it (relative to the job's volume): metrics.json is exported, and an absolute
            # path of this machine says nothing where it is read
            t.metrics["model_dir"] = str(_save_model(t.model, t.out_dir, "final-model", card))
            write_text(t.out_dir / "metrics.json", json.dumps(t.metrics, indent=2) + "\n")
            log.info("final model saved after %d steps in %.1fs: %s", t.step, elapsed, t.metrics["model_dir"])

    _on_every_rank(save)
    t.progress.finish(t.step)
    D.barrier()


def _save_model(model, out_dir: Path, name: str, card: str | None = None) -> Path:
    """A PyLate model directory (with its model card, when given) written under a temporary name, then
    renamed into place."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".tmp-{name}-{os.getpid()}"
    with whole_or_absent(tmp):  # no half model stays; a full disk (safetensors wraps it) is DiskFull's one line
        model.save(str(tmp))
        if card is not None:
            (tmp / "README.md").write_text(card)
        write_manifest(tmp)  # last: a model without a verifying manifest is not trusted (trainer/phases.py)
    replace_dir(tmp, out_dir / name)
    return out_dir / name


def _peak_rss_mb(children: bool = False) -> float:
    """Peak resident memory of this process, or of its largest finished child (a DataLoader worker)."""
    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    return round(resource.getrusage(who).ru_maxrss / 1024, 1)  # Linux reports KiB
