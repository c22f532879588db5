"""Batches: a deterministic global batch per step, this rank's share of it, tokenised lazily.

**Schedule.** A batch is a pure function of (seed, step): step ``s`` of epoch ``e`` takes the ``s``-th
slice of ``global_batch`` indices from the epoch's seeded permutation, and virtual rank ``v`` takes
the ``v``-th ``per_device`` part of it (a virtual rank is one micro-batch of one process: with
gradient accumulation, micro-batch ``m`` of rank ``r`` is virtual rank ``m * W + r``). Resuming
therefore needs only the step, every rank gets an equal batch (the tail that would not fill a global
batch is dropped), and one process with batch ``W*b`` sees exactly the examples that ``W`` ranks
with batch ``b`` see together.

**Tokens.** :class:`StreamingData` tokenises a rank's share when its batch is built (in DataLoader
workers, ahead of the step, pinned for the copy to the GPU); :class:`TokenizedData` tokenises every
row up front (``data.pretokenize: true``, for small sets). Both pad to the model's lengths and trim
each batch to its longest document, so they produce identical batches.

**Randomness.** Nothing here draws from the global random streams (those belong to dropout and are
checkpointed): the permutation has its own seeded generator, and so does the DataLoader (which
would otherwise draw its workers' base seed from the global stream when an iterator starts, and
shift a resumed run's dropout masks).
"""

from __future__ import annotations

import math
import signal
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from trainer.data.rows import DataError, Rows

__all__ = ["Batch", "StreamingData", "TokenizedData", "batches"]


@dataclass
class Batch:
    """One rank's share of one optimizer step, tokenised and on the device."""

    queries: dict[str, torch.Tensor]  # (b, q_tokens)
    documents: dict[str, torch.Tensor]  # (b * docs_per_query, d_tokens), query-major
    docs_per_query: int
    query_length: int
    document_length: int
    scores: torch.Tensor | None = None  # (b, docs_per_query), distillation only

    def _map(self, fn) -> Batch:
        tensors = lambda f: {k: fn(v) for k, v in f.items()}
        opt = lambda t: fn(t) if t is not None else None
        return Batch(
            tensors(self.queries),
            tensors(self.documents),
            self.docs_per_query,
            self.query_length,
            self.document_length,
            opt(self.scores),
        )

    def to(self, device: torch.device) -> Batch:
        return self._map(lambda t: t.to(device, non_blocking=True))

    def pin_memory(self) -> Batch:  # DataLoader's pin_memory calls this on custom batch types
        return self._map(lambda t: t.pin_memory())


def _tokenize(model, texts: list[str], is_query: bool, chunk: int = 1024) -> dict[str, torch.Tensor]:
    """Padded to the model's fixed length; batches trim unused columns later."""
    parts = [model.tokenize(texts[i : i + chunk], is_query=is_query, pad=True) for i in range(0, len(texts), chunk)]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def _trimmed(queries: dict, documents: dict, dpq: int, model, scores) -> Batch:
    width = int(documents["attention_mask"].sum(1).max())  # trim padding columns no document uses
    documents = {k: v[:, :width] for k, v in documents.items()}
    return Batch(queries, documents, dpq, model.query_length, model.document_length, scores)


class _Schedule:
    """The (seed, step) -> indices arithmetic both data classes share; subclasses build ``host_batch``."""

    def __init__(
        self,
        rows: Rows,
        model,
        per_device: int,
        virtual_ranks: int,
        seed: int,
    ):
        self.rows, self.model, self.per_device, self.seed = rows, model, per_device, seed
        self.virtual_ranks = virtual_ranks  # processes x accumulation micro-batches
        self.global_batch = per_device * virtual_ranks
        self.docs_per_query = rows.docs_per_query
        if len(rows) < self.global_batch:
            raise DataError(
                f"{rows.source}: {len(rows)} rows cannot fill one global batch of {self.global_batch} "
                f"({virtual_ranks} micro-batches of {per_device}); lower training.per_device_batch_size or add rows"
            )
        self._perm: tuple[int, torch.Tensor] | None = None

    @property
    def steps_per_epoch(self) -> int:
        return len(self.rows) // self.global_batch

    def total_steps(self, epochs: float | None, max_steps: int | None) -> int:
        return max_steps if max_steps else max(1, math.ceil(epochs * self.steps_per_epoch))

    def indices(self, step: int, rank: int) -> torch.Tensor:
        epoch, pos = divmod(step, self.steps_per_epoch)
        if self._perm is None or self._perm[0] != epoch:  # one permutation per epoch, not per step
            g = torch.Generator().manual_seed(self.seed + epoch)
            self._perm = (epoch, torch.randperm(len(self.rows), generator=g))
        global_idx = self._perm[1][pos * self.global_batch : (pos + 1) * self.global_batch]
        return global_idx[rank * self.per_device : (rank + 1) * self.per_device]

    def host_batch(self, step: int, rank: int) -> Batch:
        raise NotImplementedError


class StreamingData(_Schedule):
    """Tokenises only this rank's rows of a step, when the step's batch is built."""

    def host_batch(self, step: int, rank: int) -> Batch:
        idx = self.indices(step, rank)
        queries, documents, scores = self.rows.take(idx.tolist())
        flat = [x for docs in documents for x in docs]
        q = _tokenize(self.model, queries, is_query=True)
        d = _tokenize(self.model, flat, is_query=False)
        s = torch.tensor(scores) if scores is not None else None
        return _trimmed(q, d, self.docs_per_query, self.model, s)


class TokenizedData(_Schedule):
    """Every row tokenised up front (``data.pretokenize: true``): fast steps, memory linear in rows."""

    def __init__(
        self,
        rows: Rows,
        model,
        per_device: int,
        virtual_ranks: int,
        seed: int,
    ):
        super().__init__(rows, model, per_device, virtual_ranks, seed)
        queries, documents, scores = rows.all()
        self.queries = _tokenize(model, queries, is_query=True)
        flat_docs = [d for docs in documents for d in docs]
        self.documents = {
            k: v.view(len(rows), rows.docs_per_query, -1) for k, v in _tokenize(model, flat_docs, False).items()
        }
        self.scores = torch.tensor(scores) if scores is not None else None

    def host_batch(self, step: int, rank: int) -> Batch:
        idx = self.indices(step, rank)
        q = {k: v[idx] for k, v in self.queries.items()}
        d = {k: v[idx].flatten(0, 1) for k, v in self.documents.items()}  # (b * docs, d_tokens)
        scores = self.scores[idx] if self.scores is not None else None
        return _trimmed(q, d, self.docs_per_query, self.model, scores)


class _Steps(torch.utils.data.Dataset):
    """Item ``i`` of the remaining run -> this rank's host batch (what DataLoader workers build).

    With gradient accumulation a step has ``accumulation`` micro-batches; micro-batch ``m`` of rank
    ``r`` is virtual rank ``m * world + r`` of the step's global batch."""

    def __init__(self, data: _Schedule, start: int, total: int, rank: int, world: int, accumulation: int):
        self.data, self.start, self.total, self.rank = data, start, total, rank
        self.world, self.accumulation = world, accumulation

    def __len__(self) -> int:
        return (self.total - self.start) * self.accumulation

    def __getitem__(self, i: int) -> Batch:
        step, micro = divmod(i, self.accumulation)
        return self.data.host_batch(self.start + step, micro * self.world + self.rank)


def _worker_init(_worker_id: int) -> None:
    """Workers leave SIGTERM to the trainer: a signal to the whole process group (``local``, some
    runtimes) must not kill the batch feed before the trainer has written its stop checkpoint."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def batches(
    data: _Schedule,
    start: int,
    total: int,
    rank: int,
    device: torch.device,
    workers: int,
    world: int = 1,
    accumulation: int = 1,
) -> Iterator[Batch]:
    """Batches for steps ``start..total-1`` on ``device``, built ``workers`` steps ahead in worker
    processes (0: in this process), in pinned memory when the device is a GPU.

    The iterator (and its workers) starts here, not at the first ``next``, and draws its seed from
    a generator of its own: after this call returns, nothing in the data path touches the global
    random streams, so the caller can set a checkpoint's streams and know the next draw is dropout's."""
    if start < total:  # the epoch's order built here, once, not by every worker
        data.indices(start, 0)
    loader = torch.utils.data.DataLoader(
        _Steps(data, start, total, rank, world, accumulation),
        batch_size=None,
        shuffle=False,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        prefetch_factor=2 if workers else None,
        persistent_workers=False,
        worker_init_fn=_worker_init,
        generator=torch.Generator().manual_seed(data.seed * 1_000_003 + start * 1009 + rank),
    )
    return _Feed(iter(loader), device)


class _Feed:
    """The batches on the device; ``close()`` ends the DataLoader's workers at once. Call it on every way
    out: the workers ignore SIGTERM (above), so the interpreter's exit, which terminates daemon children
    with it, would wait on them forever (a full disk once hung a pod for days)."""

    def __init__(self, it, device: torch.device):
        self.it, self.device = it, device

    def __iter__(self) -> _Feed:
        return self

    def __next__(self) -> Batch:
        return next(self.it).to(self.device)

    def close(self) -> None:
        if hasattr(self.it, "_shutdown_workers"):  # the multiprocessing iterator's own, orderly shutdown
            self.it._shutdown_workers()
