"""Dynamic batching inside the predictor: concurrent requests answered by one call of the model.

Why: one encode of 32 queries costs far less than 32 encodes of one (the tokenizer, the framework's per-call
cost and fast-plaid's fixed cost per search are paid once, and a GPU is busy instead of idle), so a predictor
that answers requests one at a time gets no more throughput from 8 clients than from 1. KServe's own batcher
(``predictor.batcher``) groups v1 requests only, in a sidecar, with no bound on what it holds; this one groups
v1 and v2 alike, inside the process, and refuses what its queue cannot hold.

How: :meth:`Batcher.submit` queues a request and awaits its answer. One task takes the queued requests, waits at
most ``max_wait`` seconds for more (not longer once ``max_size`` is reached), and passes the batch through the
stages of ``run``, each a call on the whole batch in a worker thread, so the event loop (health and readiness
probes, new requests) goes on while the model works. One batch runs in a stage at a time (one model, one device),
and batches go through the stages in the order they were taken. A batch takes the next stage before it leaves
its own, so at most one batch waits between two stages, and the next batch is taken only once the first stage is
free: what arrives meanwhile is that batch, taken without a further wait when the wait has passed. At most
``max_queue`` requests wait: the next is refused at once with :class:`Overloaded` (the predictor's HTTP 503),
never queued without bound.

Stages: ``run`` is one callable, or a sequence of them (the engine's encode, then its search). With two, the encode
of one batch overlaps the search of the one before (torch and fast-plaid both release the GIL, so each keeps a core
busy): concurrent clients get up to twice the throughput of the stages run one after the other, as much as where the
two cost the same. Pipelining is always on: a lone client's request is a batch alone, which goes through the same
calls one after the other, as one call would, and pays one more thread hand-off (microseconds, against tens of
milliseconds a stage); what it costs is memory, at most a batch a stage and one between two stages.

Each stage answers the requests it is given in order, with a value for the next stage (the last stage's is the
answer) or an exception for that request alone, which is its answer at once: later stages see only the others.
An exception raised by a stage itself is the answer of every request of that batch, and of no other. No torch,
no kserve: testable on its own.

>>> import asyncio
>>> async def demo():
...     batcher = Batcher(lambda texts: [t.upper() for t in texts], max_wait=0.001)
...     return await asyncio.gather(*(batcher.submit(t) for t in ["a", "b", "c"])), batcher.batches
>>> asyncio.run(demo())
(['A', 'B', 'C'], deque([3], maxlen=1024))
>>> async def two_stages():  # a request that the first stage refuses is answered there
...     batcher = Batcher([lambda ts: [ValueError(t) if t == "?" else t for t in ts], lambda ts: [t * 2 for t in ts]])
...     return await asyncio.gather(*(batcher.submit(t) for t in ["a", "?", "c"]), return_exceptions=True)
>>> asyncio.run(two_stages())
['aa', ValueError('?'), 'cc']
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainer.serve import ServeError

__all__ = ["BatchOptions", "Batcher", "Overloaded", "add_batch_arguments", "batch_options"]

log = logging.getLogger("trainer.serve")


class Overloaded(RuntimeError):
    """The queue is full: the request is refused at once (HTTP 503), one line saying what to do."""


@dataclass(frozen=True)
class BatchOptions:
    """How the predictor batches concurrent requests."""

    max_wait_ms: float = 2.0
    """How long the first request of a batch waits for others. On a CPU a search takes tens of milliseconds, so
    2 ms costs a lone client a few percent; requests that arrive while a batch runs wait no longer than it."""
    max_size: int = 256
    """Texts a batch encodes at most (a search's queries, a rerank's query and documents); a larger request is a
    batch of its own."""
    max_queue: int = 64
    """Requests waiting at most; the next is answered 503 at once."""

    def __post_init__(self):
        if not 0 <= self.max_wait_ms <= 1000:
            raise ValueError(f"`max_wait_ms` must be from 0 to 1000 milliseconds, got {self.max_wait_ms}")
        if self.max_size < 1:
            raise ValueError(f"`max_size` must be 1 or more texts, got {self.max_size}")
        if self.max_queue < 1:
            raise ValueError(f"`max_queue` must be 1 or more requests, got {self.max_queue}")


@dataclass
class _Waiting:
    item: Any
    size: int
    answer: asyncio.Future = field(repr=False)


class Batcher:
    """Requests in, the stages of ``run`` called on batches of them in worker threads, each request's answer out.

    ``batches`` holds the size (in requests) of the latest batches taken, for tests and logs."""

    def __init__(
        self,
        run: Callable[[list], list] | Sequence[Callable[[list], list]],
        max_wait: float = BatchOptions.max_wait_ms / 1000,
        max_size: int = BatchOptions.max_size,
        max_queue: int = BatchOptions.max_queue,
        size: Callable[[Any], int] = lambda _: 1,
    ):
        BatchOptions(max_wait * 1000, max_size, max_queue)  # the same checks
        self.stages: tuple[Callable[[list], list], ...] = (run,) if callable(run) else tuple(run)
        if not self.stages or not all(callable(stage) for stage in self.stages):
            raise ValueError(f"`run` must be a callable or a sequence of them, got {run!r}")
        self.max_wait, self.max_size, self.max_queue, self.size = max_wait, max_size, max_queue, size
        self.batches: collections.deque[int] = collections.deque(maxlen=1024)
        self._queue: collections.deque[_Waiting] = collections.deque()
        self._arrived: asyncio.Event | None = None
        self._free: list[asyncio.Lock] = []  # one a stage: held by the batch in it
        self._flows: set[asyncio.Task] = set()  # the batches in the stages (a reference, so none is collected)
        self._worker: asyncio.Task | None = None

    @classmethod
    def of(
        cls,
        run: Callable[[list], list] | Sequence[Callable[[list], list]],
        options: BatchOptions,
        size: Callable[[Any], int],
    ) -> Batcher:
        return cls(run, options.max_wait_ms / 1000, options.max_size, options.max_queue, size)

    async def submit(self, item):
        """``item``'s answer from the last stage; :class:`Overloaded` at once when ``max_queue`` requests wait."""
        if len(self._queue) >= self.max_queue:
            raise Overloaded(
                f"the predictor has {self.max_queue} requests waiting; retry in a moment, or add replicas "
                "(serve apply --max-replicas)"
            )
        if self._worker is None or self._worker.done():
            self._arrived = asyncio.Event()
            self._free = [asyncio.Lock() for _ in self.stages]
            self._worker = asyncio.get_running_loop().create_task(self._serve())
        waiting = _Waiting(item, self.size(item), asyncio.get_running_loop().create_future())
        self._queue.append(waiting)
        self._arrived.set()
        return await waiting.answer

    async def _serve(self) -> None:
        first = self._free[0]
        while True:
            await first.acquire()  # the first stage is free: what is queued now is the next batch
            try:
                while not self._queue:
                    self._arrived.clear()
                    await self._arrived.wait()
                batch = await self._collect()
            except BaseException:
                first.release()
                raise
            if not batch:
                first.release()
                continue
            self.batches.append(len(batch))
            flow = asyncio.get_running_loop().create_task(self._flow(batch))
            self._flows.add(flow)
            flow.add_done_callback(self._flows.discard)

    async def _collect(self) -> list[_Waiting]:
        """The next batch: what is queued, and what arrives within ``max_wait``, up to ``max_size``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait
        batch: list[_Waiting] = []
        size = 0
        while True:
            while self._queue and (not batch or size + self._queue[0].size <= self.max_size):
                waiting = self._queue.popleft()
                if not waiting.answer.done():  # its client has not gone away
                    batch.append(waiting)
                    size += waiting.size
            remaining = deadline - loop.time()
            if not batch or self._queue or size >= self.max_size or remaining <= 0:
                return batch
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                pass

    async def _flow(self, batch: list[_Waiting]) -> None:
        """``batch`` through every stage, holding the first stage's lock (taken by :meth:`_serve`). It takes the
        next stage's lock before it lets go of its own: one batch a stage, at most one waiting between two stages,
        none overtaking another (an asyncio lock is taken in the order it was asked for)."""
        values = [w.item for w in batch]
        held = self._free[0]
        try:
            for i, stage in enumerate(self.stages):
                if i:
                    await self._free[i].acquire()
                    held.release()
                    held = self._free[i]
                batch, values = await self._stage(stage, batch, values, last=i == len(self.stages) - 1)
                if not batch:
                    return
        finally:
            held.release()

    @staticmethod
    async def _stage(stage, batch: list[_Waiting], values: list, last: bool) -> tuple[list[_Waiting], list]:
        """``stage(values)`` in a worker thread; each request answered that it answers (an exception, or the last
        stage's value), and the others with their values for the next stage."""
        try:
            out = await asyncio.to_thread(stage, values)
            if len(out) != len(values):
                raise RuntimeError(f"a batch of {len(values)} requests got {len(out)} answers")
        except Exception as e:  # noqa: BLE001 - each request of the batch is answered with it
            out = [e] * len(values)
        going, carried = [], []
        for waiting, value in zip(batch, out):
            if waiting.answer.done():  # its client has gone away
                continue
            if isinstance(value, BaseException):
                waiting.answer.set_exception(value)
            elif last:
                waiting.answer.set_result(value)
            else:
                going.append(waiting)
                carried.append(value)
        return going, carried


_BATCHING = [  # (flag, environment variable, BatchOptions field, type)
    ("--batch-wait-ms", "COLBERT_SERVE_BATCH_WAIT_MS", "max_wait_ms", float),
    ("--batch-size", "COLBERT_SERVE_BATCH_SIZE", "max_size", int),
    ("--queue", "COLBERT_SERVE_QUEUE", "max_queue", int),
]
_HELP = {
    "max_wait_ms": "how long a batch waits for more requests, in milliseconds",
    "max_size": "texts a batch encodes at most",
    "max_queue": "requests waiting at most; past it, HTTP 503",
}


def batch_options(args: argparse.Namespace) -> BatchOptions:
    """The batching flags (or their environment variables) as :class:`BatchOptions`; a bad one is one line."""
    given = {}
    for flag, env, name, kind in _BATCHING:
        value = getattr(args, name)
        try:
            given[name] = kind(value)
        except ValueError:
            raise ServeError(
                f"{flag} (or {env}) must be {'a number' if kind is float else 'an integer'}, got {value!r}"
            ) from None
    try:
        return BatchOptions(**given)
    except ValueError as e:
        flag, env, name, _ = next(b for b in _BATCHING if f"`{b[2]}`" in str(e))
        raise ServeError(str(e).replace(f"`{name}`", f"{flag} (or {env})")) from None


def add_batch_arguments(p: argparse.ArgumentParser) -> None:
    """The predictor's batching flags, each defaulting to its environment variable, then to BatchOptions'."""
    for flag, env, name, _ in _BATCHING:
        default = getattr(BatchOptions, name)
        p.add_argument(
            flag,
            dest=name,
            default=os.environ.get(env, str(default)),
            help=f"{_HELP[name]} (default {default}, or ${env})",
        )
