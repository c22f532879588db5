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

A store whose host is frozen, or whose node is gone without a TCP reset, does not refuse a call: the
call does not return (measured with torch 2.11: check and get still blocked 20 s and more into a 3 s
store timeout; set alone returns). So a second thread, which makes no call, judges how long the
heartbeat thread has been inside its current one.
That also keeps the exit clean: a daemon thread still inside a store call when Python exits is torn down
in C++ ("terminate called without an active exception") and the rank ends by SIGABRT, not by its own
exit code; ``stop()`` returns only once the heartbeat thread has left its call.

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
        self._stopped = threading.Event()  # stop() was called: make no further call
        self._calling_since: float | None = None  # when the heartbeat thread's current store call began
        self._thread = threading.Thread(target=self._run, name="peer-watchdog", daemon=True)
        self._judge = threading.Thread(target=self._judge_calls, name="peer-watchdog-store", daemon=True)
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
        self._judge.start()
        return self

    def stop(self) -> None:
        """Mark this rank finished (peers stop watching it) once the heartbeat thread has left its store call.
        That call returns, or the judge ends the process within ``timeout_s``: the join waits no longer."""
        self._stopped.set()
        self._thread.join(timeout=self.timeout_s + 2 * self.interval)
        if self._thread.is_alive():  # only if the judge could not run: the call holds the client, a set would wait
            return
        try:
            self._store.set(f"{_PREFIX}{self.rank}", _DONE)
        except Exception:  # the store may already be gone at the very end; peers are done too
            pass

    def _call(self, method: str, *args):
        """One store call, timed for the judge."""
        self._calling_since = time.monotonic()
        try:
            return getattr(self._store, method)(*args)
        finally:
            self._calling_since = None

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
                self._call("set", f"{_PREFIX}{self.rank}", str(beats))
                values = self._read(peers)
                store_ok = now
            except Exception:  # the store's host (rank 0's pod) is gone or unreachable
                values = {}
                if now - store_ok > self.timeout_s:
                    self._die(f"the rendezvous store at {self._host}:{self._port} (rank 0) is unreachable")
            if self._stopped.is_set():  # stopped during the calls: this rank is done, it judges no one
                return
            for r, v in values.items():
                if v != last_value.get(r):
                    last_value[r], last_change[r] = v, now
            for r in peers:
                if last_value.get(r) != _DONE and now - last_change[r] > self.timeout_s:
                    self._die(f"rank {r} has not sent a heartbeat")

    def _read(self, peers: dict[int, str]) -> dict[int, bytes | None]:
        """Each peer's counter, None for one not written yet (check() does not block on it; get() would);
        once stopped, no further peer is read."""
        values: dict[int, bytes | None] = {}
        for r, key in peers.items():
            if self._stopped.is_set():
                break
            values[r] = self._call("get", key) if self._call("check", [key]) else None
        return values

    def _judge_calls(self) -> None:
        """End the process when one store call has not returned for ``timeout_s`` (rank 0 frozen or cut off)."""
        while self._thread.is_alive():  # judges on after stop(), while the last call may still hang
            self._thread.join(self.interval)
            since = self._calling_since
            if since is not None and time.monotonic() - since > self.timeout_s:
                self._die(f"the rendezvous store at {self._host}:{self._port} (rank 0) has not answered")

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
