"""Batches: a deterministic global batch per step, this rank's share of it, tokenised lazily.

**Schedule.** A batch is a pure function of (seed, step): step ``s`` of epoch ``e`` takes the ``s``-th
slice of ``global_batch`` indices from the epoch's seeded permutation, and virtual rank ``v`` takes
the ``v``-th ``per_device`` part of it (a virtual rank is one micro-batch of one process: with
gradient accumulation, micro-batch ``m`` of rank ``r`` is virtual rank ``m * W + r``). Resuming
therefore needs only the step, every rank gets an equal batch (the tail that would not fill a global
batch is dropped), and one process with batch ``W*b`` sees exactly the examples that ``W`` ranks
with batch ``b`` see together.

**No duplicates** (``training.batch_sampler: no_duplicates``). The epoch's permutation is reordered so no
query or document text appears twice in a global batch where the rows allow it (:func:`no_duplicates_order`):
a row that would repeat one waits for the next batch. Still a function of (seed, step) alone, and of the global
batch, never of how it is split, so a checkpoint resumes on it and 1 or W ranks see the same rows. The order
is built where the batches start (the DataLoader's workers inherit it) and again by each worker at an epoch's
end.

**Negatives per row** (``training.negatives_per_row``). A step can take ``k`` of a row's negatives, the next
``k`` of its list each epoch from a seeded start per row (:meth:`_Schedule.columns`): a function of (seed, step,
row), so it splits and resumes as the order does. ``no_duplicates`` still counts every negative of a row, also
those another epoch takes: stricter than needed, never looser.

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

import collections
import math
import signal
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from trainer.data.labelled import text_key
from trainer.data.rows import DataError, Rows

__all__ = ["Batch", "StreamingData", "TokenizedData", "batches", "no_duplicates_order"]


@dataclass
class Batch:
    """One rank's share of one optimizer step, tokenised and on the device."""

    queries: dict[str, torch.Tensor]  # (b, q_tokens)
    documents: dict[str, torch.Tensor]  # (b * docs_per_query, d_tokens), query-major
    docs_per_query: int
    query_length: int
    document_length: int
    scores: torch.Tensor | None = None  # (b, docs_per_query), distillation only
    query_keys: torch.Tensor | None = None  # (b,) int64 text keys (data/labelled.py): which pairs are labelled
    document_keys: torch.Tensor | None = None  # (b * docs_per_query,)

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
            opt(self.query_keys),
            opt(self.document_keys),
        )

    def to(self, device: torch.device) -> Batch:
        return self._map(lambda t: t.to(device, non_blocking=True))

    def pin_memory(self) -> Batch:  # DataLoader's pin_memory calls this on custom batch types
        return self._map(lambda t: t.pin_memory())


def _tokenize(model, texts: list[str], is_query: bool, chunk: int = 1024) -> dict[str, torch.Tensor]:
    """Padded to the model's fixed length; batches trim unused columns later."""
    parts = [model.tokenize(texts[i : i + chunk], is_query=is_query, pad=True) for i in range(0, len(texts), chunk)]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def _trimmed(queries: dict, documents: dict, dpq: int, model, scores, keys=(None, None)) -> Batch:
    width = int(documents["attention_mask"].sum(1).max())  # trim padding columns no document uses
    documents = {k: v[:, :width] for k, v in documents.items()}
    return Batch(queries, documents, dpq, model.query_length, model.document_length, scores, *keys)


def _keys(queries: list[str], documents: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([text_key(t) for t in queries]), torch.tensor([text_key(t) for t in documents])


class _Schedule:
    """The (seed, step) -> indices arithmetic both data classes share; subclasses build ``host_batch``."""

    keys = False  # set to give each batch its texts' keys (loss.mask_labelled_positives)

    def __init__(
        self,
        rows: Rows,
        model,
        per_device: int,
        virtual_ranks: int,
        seed: int,
        sampler: str = "random",
        negatives_per_row: int | None = None,
    ):
        self.rows, self.model, self.per_device, self.seed = rows, model, per_device, seed
        self.virtual_ranks = virtual_ranks  # processes x accumulation micro-batches
        self.global_batch = per_device * virtual_ranks
        self.docs_per_query = 1 + negatives_per_row if negatives_per_row else rows.docs_per_query
        self._rotation = _rotation(rows, negatives_per_row, seed) if negatives_per_row else None
        if len(rows) < self.global_batch:
            raise DataError(
                f"{rows.source}: {len(rows)} rows cannot fill one global batch of {self.global_batch} "
                f"({virtual_ranks} micro-batches of {per_device}); lower training.per_device_batch_size or add rows"
            )
        self._perm: tuple[int, torch.Tensor] | None = None
        self._texts = _row_keys(rows) if sampler == "no_duplicates" else None  # before DataLoader workers fork

    @property
    def steps_per_epoch(self) -> int:
        return len(self.rows) // self.global_batch

    def total_steps(self, epochs: float | None, max_steps: int | None) -> int:
        return max_steps if max_steps else max(1, math.ceil(epochs * self.steps_per_epoch))

    def indices(self, step: int, rank: int) -> torch.Tensor:
        epoch, pos = divmod(step, self.steps_per_epoch)
        if self._perm is None or self._perm[0] != epoch:  # one permutation per epoch, not per step
            g = torch.Generator().manual_seed(self.seed + epoch)
            perm = torch.randperm(len(self.rows), generator=g)
            if self._texts is not None:
                perm = torch.tensor(no_duplicates_order(perm.tolist(), self._texts, self.global_batch))
            self._perm = (epoch, perm)
        global_idx = self._perm[1][pos * self.global_batch : (pos + 1) * self.global_batch]
        return global_idx[rank * self.per_device : (rank + 1) * self.per_device]

    def columns(self, step: int, idx: torch.Tensor) -> torch.Tensor | None:
        """Which of each row's documents step ``step`` trains on, (len(idx), docs_per_query): the positive, then
        the next ``negatives_per_row`` of the row's negatives in epoch order. None: all of them, as stored.

        Epoch ``e`` of row ``i`` takes negatives ``start[i] + e*k ... + k - 1`` (mod the row's count), so a run
        of ``count / k`` epochs trains on every negative once; a function of (seed, step, row) like the order."""
        if self._rotation is None:
            return None
        start, pool = self._rotation
        k = self.docs_per_query - 1
        epoch = step // self.steps_per_epoch
        negatives = 1 + (start[idx, None] + epoch * k + torch.arange(k)) % pool
        return torch.cat([torch.zeros(len(idx), 1, dtype=torch.long), negatives], dim=1)

    def host_batch(self, step: int, rank: int) -> Batch:
        raise NotImplementedError


def _rotation(rows: Rows, per_row: int, seed: int) -> tuple[torch.Tensor, int]:
    """Each row's first negative (seeded) and how many it has: ``training.negatives_per_row``'s rotation."""
    pool = rows.docs_per_query - 1
    if per_row >= pool:
        raise DataError(
            f"{rows.source}: training.negatives_per_row {per_row} needs rows with more negatives than that; "
            f"these have {pool}: raise mine.negatives, or remove training.negatives_per_row"
        )
    return torch.randint(pool, (len(rows),), generator=torch.Generator().manual_seed(seed)), pool


def _row_keys(rows: Rows, chunk: int = 65_536) -> np.ndarray:
    """Each row's texts (its query and documents) as int64 keys, a row per line: one array, not a Python object
    per key, so forked DataLoader workers share it instead of copying it."""
    keys = np.empty((len(rows), 1 + rows.docs_per_query), dtype=np.int64)
    for start in range(0, len(rows), chunk):
        queries, documents, _ = rows.take(list(range(start, min(start + chunk, len(rows)))))
        rows_keys = [(text_key(q), *map(text_key, docs)) for q, docs in zip(queries, documents)]
        keys[start : start + len(queries)] = rows_keys
    return keys


def no_duplicates_order(order: list[int], texts, batch: int, look_ahead: int = 8) -> list[int]:
    """``order`` rearranged so that each run of ``batch`` rows shares no text (``texts[i]``: row i's keys): a row
    that repeats one of the batch's texts is put off to the next batch, ahead of the rows not yet placed. Every
    row is kept. A batch that the next ``look_ahead`` x ``batch`` rows cannot fill takes rows that repeat a text:
    at the epoch's end, and wherever a few texts are in most rows (a document that is the positive of half the
    queries cannot be in every batch once); the look-ahead bounds the work at rows x look_ahead.

    >>> texts = [("q1", "d1"), ("q2", "d1"), ("q3", "d2"), ("q4", "d3")]
    >>> no_duplicates_order([0, 1, 2, 3], texts, 2)
    [0, 2, 1, 3]
    >>> no_duplicates_order([0, 1], [("q", "d"), ("q", "e")], 2)  # nothing else to take: kept as it comes
    [0, 1]
    """
    out: list[int] = []
    pending = collections.deque(order)
    while pending:
        taken, seen, put_off = [], set(), []
        while pending and len(taken) < batch and len(taken) + len(put_off) < look_ahead * batch:
            i = pending.popleft()
            keys = texts[i].tolist() if isinstance(texts[i], np.ndarray) else texts[i]
            if seen.isdisjoint(keys):
                taken.append(i)
                seen.update(keys)
            else:
                put_off.append(i)
        fill = batch - len(taken)  # no row within reach fits: the first put off go in as they are
        taken += put_off[:fill]
        out += taken
        pending.extendleft(reversed(put_off[fill:]))
    return out


class StreamingData(_Schedule):
    """Tokenises only this rank's rows of a step, when the step's batch is built."""

    def host_batch(self, step: int, rank: int) -> Batch:
        idx = self.indices(step, rank)
        queries, documents, scores = self.rows.take(idx.tolist())
        columns = self.columns(step, idx)
        if columns is not None:  # training.negatives_per_row: this epoch's share of each row's negatives
            documents = [[docs[c] for c in row] for docs, row in zip(documents, columns.tolist())]
            scores = [[s[c] for c in row] for s, row in zip(scores, columns.tolist())] if scores is not None else None
        flat = [x for docs in documents for x in docs]
        q = _tokenize(self.model, queries, is_query=True)
        d = _tokenize(self.model, flat, is_query=False)
        s = torch.tensor(scores) if scores is not None else None
        return _trimmed(q, d, self.docs_per_query, self.model, s, _keys(queries, flat) if self.keys else (None, None))


class TokenizedData(_Schedule):
    """Every row tokenised up front (``data.pretokenize: true``): fast steps, memory linear in rows."""

    def __init__(
        self,
        rows: Rows,
        model,
        per_device: int,
        virtual_ranks: int,
        seed: int,
        sampler: str = "random",
        negatives_per_row: int | None = None,
    ):
        super().__init__(rows, model, per_device, virtual_ranks, seed, sampler, negatives_per_row)
        queries, documents, scores = rows.all()
        self.queries = _tokenize(model, queries, is_query=True)
        flat_docs = [d for docs in documents for d in docs]
        self.documents = {
            k: v.view(len(rows), rows.docs_per_query, -1) for k, v in _tokenize(model, flat_docs, False).items()
        }
        self.scores = torch.tensor(scores) if scores is not None else None
        q_keys, d_keys = _keys(queries, flat_docs)
        self.key_table = (q_keys, d_keys.view(len(rows), rows.docs_per_query))

    def host_batch(self, step: int, rank: int) -> Batch:
        idx = self.indices(step, rank)
        columns = self.columns(step, idx)
        pick = (lambda t: t[idx]) if columns is None else (lambda t: t[idx[:, None], columns])  # (b, docs, ...)
        q = {k: v[idx] for k, v in self.queries.items()}
        d = {k: pick(v).flatten(0, 1) for k, v in self.documents.items()}
        keys = (self.key_table[0][idx], pick(self.key_table[1]).flatten()) if self.keys else (None, None)
        scores = pick(self.scores) if self.scores is not None else None
        return _trimmed(q, d, self.docs_per_query, self.model, scores, keys)


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
    if start < total:  # the epoch's order built here, once, not by every worker (no_duplicates: a pass over rows)
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
