"""One resume decision for the whole job, and the state every rank saves and restores.

On a cluster each pod has its own ``/workspace`` (an ``emptyDir`` unless a PVC is mounted) and only
rank 0 writes checkpoints, so a worker's directory is empty after a restart. Every rank looking for
"its own" newest checkpoint therefore resumes different ranks at different steps, and they then hang
in mismatched collectives. Here rank 0 alone reads the checkpoint directory, checks the checkpoint
against this job, and broadcasts the state; every rank restores the same step, weights, optimizer,
scheduler, scaler and data position (batches are a pure function of (seed, step)), plus its own RNG
streams. :func:`check_same_weights` then proves the ranks agree, after resume and at every checkpoint.

RNG streams are what make a resumed run end byte for byte where an uninterrupted one does, with
dropout on. Each rank saves the CPU stream, Python's, and the CUDA stream *of the device it trains
on* (never every visible device: a job may come back with the same world size in another layout,
2 nodes x 4 GPUs as 4 x 2, and each process then sees other devices). The loop sets them with
:func:`set_rng` as the very last thing before the next step, after everything that could draw from
them (the DataLoader draws its workers' base seed; it has its own generator now, but so would
anything added later).
"""

from __future__ import annotations

import gc
import logging
import random
from pathlib import Path
from typing import Any

import torch

from trainer import distributed as D
from trainer.config.schema import TrainConfig
from trainer.errors import NonFinite, WeightsDiverged
from trainer.run.checkpoint import CHECKPOINT_FORMAT, CheckpointError, latest_checkpoint, save_checkpoint
from trainer.run.state import TrainState

__all__ = [
    "CheckpointError",
    "WeightsDiverged",
    "capture",
    "carried_metrics",
    "derived_rng",
    "restore",
    "rng_state",
    "set_rng",
    "load_for_job",
    "save",
    "check_same_weights",
    "check_compatible",
    "apply_changed_hyperparameters",
]

log = logging.getLogger(__name__)

# Keys whose change makes a checkpoint meaningless for this job (others, e.g. max_steps, may change).
_MUST_MATCH = (
    ("model",),
    ("loss",),
    ("training", "per_device_batch_size"),
    ("training", "global_batch_size"),
    ("training", "seed"),
    ("training", "gather_across_devices"),
    ("training", "gradient_accumulation_steps"),
    ("training", "lr_scheduler"),
    ("data", "train", "columns"),
    ("data", "train", "limit"),
)
# Levers the schema no longer has, and the value this trainer runs as: a checkpoint a build before their removal
# wrote with another value trained another way (another epoch order, share of negatives, or groups and schedule).
_REMOVED = {
    ("training", "batch_sampler"): "random",
    ("training", "negatives_per_row"): None,
    ("training", "head_only_steps"): 0,
}


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's random streams: CPU, Python, and the CUDA stream of its own training device."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def derived_rng(seed: int, step: int, rank: int, device: torch.device) -> dict[str, Any]:
    """The streams of ``rank`` resuming at ``step`` on another world size than the checkpoint's: a
    function of (seed, step, rank) alone, so every restart at that shape draws the same dropout."""
    value = seed * 1_000_003 + step * 1009 + rank
    cpu = torch.Generator().manual_seed(value).get_state()
    python = random.Random(value).getstate()
    state = {"torch": cpu, "python": python}
    if device.type == "cuda":
        with torch.cuda.device(device):
            kept = torch.cuda.get_rng_state()
            torch.cuda.manual_seed(value)
            state["cuda"] = torch.cuda.get_rng_state()
            torch.cuda.set_rng_state(kept)
    return state


def set_rng(state: dict[str, Any], device: torch.device) -> None:
    """Set what :func:`rng_state` captured, the CUDA stream onto this process's device (whichever it is)."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if device.type == "cuda" and isinstance(state.get("cuda"), torch.Tensor):
        torch.cuda.set_rng_state(state["cuda"], device)


def capture(t: TrainState) -> dict | None:
    """The job's state at ``t.step``: every rank's RNG gathered, the rest from rank 0 (None elsewhere).
    ``trainer/run/checkpoint.py``'s header lists the keys."""
    all_rng = D.gather_objects(rng_state(t.device))
    if D.rank() != 0:
        return None
    return {
        "format": CHECKPOINT_FORMAT,  # what the keys below mean; another format is refused (check_compatible)
        "step": t.step,
        "world_size": t.layout.world_size,
        "model": t.model.state_dict(),
        "optimizer": t.optimizer.state_dict(),
        "scheduler": t.scheduler.state_dict(),
        "scaler": t.scaler.state_dict() if t.scaler.is_enabled() else None,
        "rng": all_rng,
        "config": t.cfg.model_dump(mode="json"),
        "metrics": t.metrics,
        "data": t.data_identity,  # the identity of the rows trained on (Rows.identity: every row's content)
        "skipped_nonfinite": t.skipped_nonfinite,  # training.skip_nonfinite_steps' budget is per job, not per restart
    }


def save(ckpt_dir: Path, state: dict | None, keep_last: int) -> Path | None:
    """Rank 0 writes the checkpoint atomically; other ranks return None."""
    if state is None:
        return None
    path = save_checkpoint(ckpt_dir, state["step"], state, keep_last)
    log.info("checkpoint %s", path)
    return path


def _dig(d: Any, keys: tuple[str, ...]) -> Any:
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def _saved(saved: dict, keys: tuple[str, ...], cfg) -> Any:
    """The value a checkpoint's config holds at ``keys``; a key its config predates reads as the key's default,
    which that job ran with."""
    parent = _dig(saved, keys[:-1]) if len(keys) > 1 else saved
    if not isinstance(parent, dict) or keys[-1] in parent:
        return _dig(saved, keys)
    owner = cfg
    for k in keys[:-1]:
        owner = getattr(owner, k, None)
    field = type(owner).model_fields.get(keys[-1]) if owner is not None else None
    return field.default if field is not None and isinstance(field.default, str | int | float | bool) else None


def check_compatible(
    path: Path, state: dict, cfg, world_size: int, data: str | None = None, data_sampled: str | None = None
) -> None:
    """Refuse a checkpoint of another config, of other rows (``data``: ``Rows.identity``; ``data_sampled``:
    ``Rows.sampled_identity``, for a checkpoint 0.3 wrote), or of another world size unless the config fixes the
    global batch (``training.global_batch_size``: the same batches and mathematics on any world size), with one
    line."""
    if state.get("format", CHECKPOINT_FORMAT) != CHECKPOINT_FORMAT:  # none: written before the key existed
        raise CheckpointError(
            f"checkpoint {path} has format {state['format']!r}, this trainer reads format {CHECKPOINT_FORMAT}; "
            "resume it with the colbert-k8s version that wrote it, or use a new output_dir"
        )
    saved_ws = state.get("world_size", len(state.get("rng", [])))
    if saved_ws != world_size and cfg.training.global_batch_size is None:
        raise CheckpointError(
            f"checkpoint {path} was written by a job of world size {saved_ws}, this job has {world_size}: "
            f"its per-device batch is per rank; run with {saved_ws} processes, set training.global_batch_size "
            "(an elastic job), or start over with a new output_dir (or checkpoint.resume: false)"
        )
    saved = state.get("data")
    want = data if str(saved).startswith("sha256:") else data_sampled  # 0.3's had no prefix: 64 rows sampled
    if None not in (saved, want) and saved != want:
        raise CheckpointError(
            f"checkpoint {path} was trained on other rows than data.train holds now ({cfg.data.train.path}: "
            "another file, rows edited or added, or rows mined with other mine: settings); "
            "resuming would train on two data sets: use a new output_dir, or put the old data back"
        )
    for keys, runs_as in _REMOVED.items():
        if (old := _dig(state.get("config", {}), keys)) not in (None, runs_as):
            raise CheckpointError(
                f"checkpoint {path} was written with {'.'.join(keys)}={old!r}, which 0.4.0 removed (this trainer "
                f"runs as {runs_as!r}): resume it with the version that wrote it, or use a new output_dir"
            )
    now = cfg.model_dump(mode="json")
    for keys in _MUST_MATCH:
        old, new = _saved(state.get("config", {}), keys, cfg), _dig(now, keys)
        if old != new:
            raise CheckpointError(
                f"checkpoint {path} was written with {'.'.join(keys)}={old!r}, this config has {new!r}: "
                "use a new output_dir for a different job, or restore the old value to resume"
            )


def load_for_job(
    ckpt_dir: Path, cfg, world_size: int, data: str | None = None, data_sampled: str | None = None
) -> tuple[Path, dict] | None:
    """Rank 0 picks and checks the checkpoint (or none; ``data``, ``data_sampled``: see :func:`check_compatible`);
    every rank receives the same answer."""
    answer: tuple[Path, dict] | None | CheckpointError = None
    if D.rank() == 0 and cfg.checkpoint.resume:
        try:
            answer = latest_checkpoint(ckpt_dir)
            if answer:
                check_compatible(answer[0], answer[1], cfg, world_size, data, data_sampled)
        except CheckpointError as e:
            answer = e
    answer = D.broadcast_object(answer)
    if isinstance(answer, CheckpointError):
        raise CheckpointError(str(answer))
    return answer


def apply_changed_hyperparameters(
    state_config: dict,
    cfg: TrainConfig,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    decay_group: int = 0,
) -> list[str]:
    """A checkpoint restores the optimizer's and scheduler's own copies of the learning rate and weight decay;
    the config's new values replace them here (the schedule keeps its shape and position, scaled to the new
    peak), so a changed value is applied, never silently dropped. Returns a line per change, for the log."""
    changes = []
    old_lr = _dig(state_config, ("training", "learning_rate"))
    new_lr = cfg.training.learning_rate
    old_head = _dig(state_config, ("training", "head_learning_rate")) or old_lr
    new_head = cfg.training.head_learning_rate or new_lr
    for key, old, new, groups in (
        ("learning_rate", old_lr, new_lr, range(min(2, len(optimizer.param_groups)))),
        ("head_learning_rate", old_head, new_head, range(2, len(optimizer.param_groups))),  # the head's group
    ):
        if old is None or old == new or not groups:
            continue
        ratio = new / old
        for i in groups:
            scheduler.base_lrs[i] *= ratio
            group = optimizer.param_groups[i]
            group["lr"] *= ratio
            group["initial_lr"] = group.get("initial_lr", old) * ratio
        changes.append(f"training.{key} {old} -> {new} (the schedule goes on at the new peak)")
    old_wd = _dig(state_config, ("training", "weight_decay"))
    if old_wd is not None and old_wd != cfg.training.weight_decay:
        for i in (decay_group, *range(2, len(optimizer.param_groups))):  # the encoder's matrices and the head
            optimizer.param_groups[i]["weight_decay"] = cfg.training.weight_decay
        changes.append(f"training.weight_decay {old_wd} -> {cfg.training.weight_decay}")
    return changes


def restore(t: TrainState, path: Path, state: dict) -> None:
    """Load ``state`` (read from ``path``) into ``t``: weights, optimizer, scheduler, scaler, step, metrics, the
    non-finite skips so far, and this rank's RNG streams into ``t.rng`` for :func:`set_rng` (None on a rank the
    checkpoint's job did not have: see :func:`derived_rng`). The loaded copy is freed."""
    try:
        t.model.load_state_dict(state["model"])
    except RuntimeError as e:
        first = str(e).splitlines()[1].strip() if "\n" in str(e) else str(e)
        raise CheckpointError(
            f"checkpoint {path} holds the weights of another model ({first[:160]}); "
            "use a new output_dir for this model, or set model.name_or_path back"
        ) from None
    t.optimizer.load_state_dict(state["optimizer"])
    t.scheduler.load_state_dict(state["scheduler"])
    if t.scaler.is_enabled() and state.get("scaler"):
        t.scaler.load_state_dict(state["scaler"])
    rank = t.layout.rank
    t.rng = state["rng"][rank] if len(state["rng"]) > rank else None
    t.step = state["step"]
    t.metrics.update(carried_metrics(t.metrics, state.get("metrics", {}), t.step))  # e.g. the evaluation before
    t.skipped_nonfinite = state.get("skipped_nonfinite", 0)  # else a restart renewed the skip budget
    state.clear()
    gc.collect()


_THIS_RUN = ("world_size", "device", "precision")  # where a run trains: always this run's, never a checkpoint's


def carried_metrics(now: dict, saved: dict, step: int) -> dict:
    """The metrics a run resumed at ``step`` goes on with: the checkpoint's (``saved``: the evaluation before
    training, the best so far, fp16's skips), except where this run trains (``now``: its world size, device and
    precision, which the checkpoint's used to overwrite). A resume where those changed adds this run to
    ``history``, which starts with the checkpoint's own (at step 0 unless it already has one).

    >>> old = {"world_size": 2, "device": "CPU", "precision": "fp32", "before": {"ndcg@10": 0.5}}
    >>> carried_metrics({"world_size": 1, "device": "CPU", "precision": "fp32"}, old, 6)["history"]
    ... # doctest: +NORMALIZE_WHITESPACE
    [{'step': 0, 'world_size': 2, 'device': 'CPU', 'precision': 'fp32'},
     {'step': 6, 'world_size': 1, 'device': 'CPU', 'precision': 'fp32'}]
    """
    merged = {**saved, **{k: now[k] for k in _THIS_RUN if k in now}}
    if not any(k in saved for k in _THIS_RUN):  # a checkpoint that does not say where it trained
        return merged
    here = {k: now.get(k) for k in _THIS_RUN}
    history = list(saved.get("history") or [{"step": 0, **{k: saved.get(k) for k in _THIS_RUN}}])
    if {k: history[-1].get(k) for k in _THIS_RUN} != here:
        history.append({"step": step, **here})
    if len(history) > 1:
        merged["history"] = history
    return merged


def check_same_weights(model, where: str) -> None:
    """Compare a checksum of every parameter across ranks; every rank raises together on a mismatch."""
    names, sums = [], []
    for name, p in model.state_dict().items():
        if p.is_floating_point():
            t = p.detach().double()
            names.append(name)
            sums.append(torch.stack([t.sum(), (t * t).sum()]))
    mine = torch.stack(sums).cpu()
    every = D.gather_objects(mine)  # first: every rank then decides alike, whichever rank went non-finite
    for theirs in every:
        if not torch.isfinite(theirs).all():  # NaN != NaN: it read as "weights differ between rank 0 and rank 0"
            bad = names[int((~torch.isfinite(theirs)).any(dim=1).nonzero()[0])]
            raise NonFinite(
                f"weights are not finite {where} (first: {bad}); nothing is saved from them. Check the rows "
                "before this step (teacher scores) or lower training.learning_rate"
            )
    for r, theirs in enumerate(every):
        if not torch.equal(theirs, mine):
            bad = int((theirs != mine).any(dim=1).nonzero()[0])
            raise WeightsDiverged(
                f"weights differ between rank {D.rank()} and rank {r} {where} (first: {names[bad]}); "
                "stopping so the job restarts from the last good checkpoint"
            )
    log.info("weights identical on all ranks %s (%d tensors checked)", where, len(names))
