"""SIGTERM (node drain, preemption, ``kubectl delete pod``) becomes a checkpoint and a clean exit.

The kubelet sends SIGTERM, waits ``terminationGracePeriodSeconds`` (the manifests set it), then
SIGKILLs. The handler only records the request; the loop finishes the step in flight, every rank
learns of the request through the per-step all-reduce (so a signal to one pod stops all of them at
the same step), rank 0 writes a checkpoint of that step, and the trainer exits with 143 (128 +
SIGTERM), which the operator's ``OnFailure`` policy restarts and the next start resumes from.
"""

from __future__ import annotations

import logging
import signal
import threading

from trainer.errors import JobVerdict

__all__ = ["StopRequest", "Preempted", "EXIT_PREEMPTED"]

log = logging.getLogger(__name__)
EXIT_PREEMPTED = 128 + signal.SIGTERM


class Preempted(JobVerdict):
    """Raised after the stop checkpoint is written; ``main`` turns it into exit code 143."""

    def __init__(self, step: int):
        super().__init__(f"stopped by SIGTERM after step {step}; the checkpoint of that step resumes it")
        self.step = step


class StopRequest:
    """A context that turns SIGTERM into a flag for the training loop (main thread only)."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def _handle(self, signum, _frame) -> None:
        if not self.requested:
            log.warning("received %s: finishing the current step, then checkpointing", signal.Signals(signum).name)
        self.requested = True

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
