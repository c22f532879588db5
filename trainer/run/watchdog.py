"""Notice a dead or frozen peer in about a minute, not after the process-group timeout.

When a pod dies with its node, or freezes, no TCP reset reaches the others: gloo and NCCL survivors
sit in their collective until ``distributed.timeout_seconds`` (30 minutes by default), and only then
exit so the operator restarts them. A shorter collective timeout would also kill healthy slow
phases (rank 0 evaluating or writing a large checkpoint while the others wait).

So liveness is measured apart from progress: a daemon thread on every rank bumps a counter
``colbert-k8s/heartbeat/<rank>`` on the job's rendezvous store (the TCPStore at MASTER_ADDR, through
a client connection of its own) and reads everyone else's. A rank busy in a long step still beats,
because the thread runs while the main thread waits in C++. A peer whose counter has not moved for
``peer_timeout_seconds`` of this process's clock (no clock comparison across nodes), or a store that
stays unreachable as long (rank 0 is gone), ends this process with exit code 129 (retryable,
trainer/errors.py) and one line.

One watchdog watches the whole process group (:func:`watching`): mining, teacher scoring, every round
and training (``trainer/rounds.py`` opens it with the group; ``trainer/train.py``'s is then a no-op).
So the counters run on across phases and are never restarted by one: a rank entering the next phase
cannot be mistaken for a rank whose counter went back, nor be marked done by the phase before. It is
stopped on every way out (success, a verdict, an exception), before the group and its store go.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator

from trainer.errors import EXIT_PEER

__all__ = ["PeerWatchdog", "EXIT_PEER_LOST", "watching"]

log = logging.getLogger(__name__)
EXIT_PEER_LOST = EXIT_PEER  # retryable (trainer/errors.py)
_PREFIX = "colbert-k8s/heartbeat/"
_DONE = b"done"
_running: PeerWatchdog | None = None  # the one of this process's group, while it runs


@contextlib.contextmanager
def watching(distributed: bool, rank: int, world_size: int, timeout_s: float) -> Iterator[None]:
    """A :class:`PeerWatchdog` while the block runs, inside the process group; a no-op without a group
    and inside a block that already watches (a round's training inside ``trainer/rounds.py``'s)."""
    global _running
    import torch.distributed as dist

    if _running is not None or not (distributed and dist.is_initialized()):
        yield
        return
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    dog = _running = PeerWatchdog(rank, world_size, addr, port, timeout_s).start()
    try:
        yield
    finally:
        _running = None
        dog.stop()


class PeerWatchdog:
    """Heartbeats on the rendezvous store; ``stop()`` marks this rank done so peers never wait on it."""

    def __init__(self, rank: int, world_size: int, host: str, port: int, timeout_s: float):
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.interval = max(0.5, timeout_s / 12)
        self._host, self._port = host, port
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peer-watchdog", daemon=True)
        self._store = None

    def start(self) -> PeerWatchdog:
        import torch.distributed as dist

        self._store = dist.TCPStore(
            self._host,
            self._port,
            is_master=False,
            timeout=datetime.timedelta(seconds=max(5.0, self.interval * 2)),
            wait_for_workers=False,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Mark this rank finished (peers stop watching it) and end the thread."""
        self._stopped.set()
        self._thread.join(timeout=self.interval * 2)
        try:
            self._store.set(f"{_PREFIX}{self.rank}", _DONE)
        except Exception:  # the store may already be gone at the very end; peers are done too
            pass

    def _run(self) -> None:
        beats = 0
        peers = {r: f"{_PREFIX}{r}" for r in range(self.world_size) if r != self.rank}
        last_value: dict[int, bytes | None] = {}
        last_change = {r: time.monotonic() for r in peers}
        store_ok = time.monotonic()
        while not self._stopped.wait(self.interval):
            now = time.monotonic()
            try:
                beats += 1
                self._store.set(f"{_PREFIX}{self.rank}", str(beats))
                # check() does not block on a key a slower peer has not written yet; get() would
                values = {r: self._store.get(k) if self._store.check([k]) else None for r, k in peers.items()}
                store_ok = now
            except Exception:  # the store's host (rank 0's pod) is gone or unreachable
                values = {}
                if now - store_ok > self.timeout_s:
                    self._die(f"the rendezvous store at {self._host}:{self._port} (rank 0) is unreachable")
            for r, v in values.items():
                if v != last_value.get(r):
                    last_value[r], last_change[r] = v, now
            for r in peers:
                if last_value.get(r) != _DONE and now - last_change[r] > self.timeout_s:
                    self._die(f"rank {r} has not sent a heartbeat")

    def _die(self, why: str) -> None:
        msg = (
            f"{why} for {self.timeout_s:.0f}s (distributed.peer_timeout_seconds); "
            f"exiting with code {EXIT_PEER_LOST} so the job restarts from its newest checkpoint"
        )
        log.error(msg)
        for h in logging.getLogger().handlers:
            h.flush()
        sys.stderr.flush()
        os._exit(EXIT_PEER_LOST)  # the main thread is stuck in a collective; nothing else can end it
