"""How big a step is: the global batch split into per-device micro-batches for a world size.

``colbert-k8s render``/``submit`` print the same :class:`Scale` line the trainer logs, and ``resize`` refuses
a world size :func:`micro_batches` cannot split ``training.global_batch_size`` over. Pure arithmetic on the
config (no torch), so both sides compute it alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.config.schema import ConfigError, TrainConfig
from trainer.losses import LOSSES

__all__ = ["Scale", "job_scale", "micro_batches"]


@dataclass(frozen=True)
class Scale:
    """How big a step is: computed once, printed identically by ``render``/``submit`` and the trainer."""

    world_size: int
    per_device: int
    accumulation: int
    docs_per_query: int  # positive + negatives of a row (contrastive losses)
    gather: bool
    loss: str

    @property
    def global_batch(self) -> int:
        """Queries per optimizer step."""
        return self.world_size * self.per_device * self.accumulation

    @property
    def negatives_per_query(self) -> int:
        """Documents each query is scored against besides its positive (0 for a loss that reads teacher scores).

        Contrastive losses draw them from one micro-batch (across ranks when gathering), never
        across accumulation micro-batches: accumulation grows the global batch, not the negatives."""
        if LOSSES[self.loss].scored:
            return 0
        return self.per_device * (self.world_size if self.gather else 1) * self.docs_per_query - 1

    def line(self) -> str:
        return (
            f"world size {self.world_size} x per-device batch {self.per_device} x accumulation "
            f"{self.accumulation} = global batch {self.global_batch}; in-batch negatives per query "
            f"{self.negatives_per_query} ({'gathered across ranks' if self.gather else 'this rank only'}, "
            f"per micro-batch; loss {self.loss})"
        )


def _split(global_batch: int, world_size: int, cap: int) -> tuple[int, int] | None:
    """(micro-batch, accumulation) with the fewest micro-batches of at most ``cap`` that cover the
    global batch exactly on ``world_size`` processes; None when there is none."""
    if global_batch % world_size:
        return None
    share = global_batch // world_size  # each process's queries per step
    for accumulation in range(1, share + 1):
        if share % accumulation == 0 and share // accumulation <= cap:
            return share // accumulation, accumulation
    return None


def micro_batches(cfg: TrainConfig, world_size: int) -> tuple[int, int]:
    """(queries per micro-batch per process, micro-batches per step) of ``cfg`` on ``world_size`` processes.

    Without ``training.global_batch_size``: the config's own two numbers. With it, both are derived so that
    every step still covers exactly that many queries: the same mathematics on any world size.
    Contrastive losses take their in-batch negatives from one micro-batch, so they never accumulate; the
    losses that read teacher scores (distillation) sum over micro-batches, so a micro-batch is capped by
    ``per_device_batch_size``."""
    t = cfg.training
    if t.global_batch_size is None:
        return t.per_device_batch_size, t.gradient_accumulation_steps
    g = t.global_batch_size
    cap = t.per_device_batch_size if cfg.loss.scored else g
    if (split := _split(g, world_size, cap)) is not None:
        return split
    fits = [w for w in range(1, min(g, 4096) + 1) if _split(g, w, cap) is not None]
    raise ConfigError(
        f"training.global_batch_size {g} cannot be split over {world_size} processes"
        + ("" if cap == g else f" in micro-batches of at most {cap} (training.per_device_batch_size)")
        + f"; world sizes that work: {', '.join(map(str, fits[:16]))}{' ...' if len(fits) > 16 else ''}"
    )


def job_scale(cfg: TrainConfig, world_size: int) -> Scale:
    """The :class:`Scale` of ``cfg`` run by ``world_size`` processes."""
    t = cfg.training
    gather = t.gather_across_devices if t.gather_across_devices is not None else world_size > 1
    per_device, accumulation = micro_batches(cfg, world_size)
    negatives = cfg.mine.negatives if cfg.mine else len(cfg.data.train.columns.negatives)
    return Scale(
        world_size=world_size,
        per_device=per_device,
        accumulation=accumulation,
        docs_per_query=1 + negatives,
        gather=gather,
        loss=cfg.loss.name,
    )
