"""SIGTERM (node drain, preemption, ``kubectl delete pod``) becomes a clean stop at the next safe point.

The kubelet sends SIGTERM, waits ``terminationGracePeriodSeconds`` (the manifests set it), then
SIGKILLs. The handler only records the request, for the whole job: ``trainer/rounds.py`` enters one
:class:`StopRequest` around every phase, and each phase honours it at its next safe point:

- training: the step in flight finishes; every rank learns of the request through the per-step
  all-reduce (so a signal to one pod stops all of them at the same step), rank 0 checkpoints that step;
- mining: the part in flight is written (``trainer/mine.py``);
- between phases (evaluation and the final model, the index, the next round's mining, the export):
  :meth:`StopRequest.honour`, before the next phase starts.

Then the trainer exits with 143 (128 + SIGTERM), which the operator's policies restart, and the next
start resumes: from the step's checkpoint, from the parts already mined, or from the first phase that is
not whole (``trainer/phases.py``).
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
    """Raised by every rank at the same safe point once a pod got SIGTERM; ``main`` turns it into exit code 143."""

    def __init__(self, where: str, resumes: str = "a restart resumes from there; what is done is kept"):
        super().__init__(f"stopped by SIGTERM {where}; {resumes}")

    @classmethod
    def at_step(cls, step: int) -> Preempted:
        """The training loop's stop: its checkpoint is written."""
        return cls(f"after step {step}", "the checkpoint of that step resumes it")


class StopRequest:
    """A context that turns SIGTERM into a flag that the job's phases honour (main thread only)."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def _handle(self, signum, _frame) -> None:
        if not self.requested:
            log.warning(
                "received %s: stopping at the next safe point (the end of the step, mined part or phase in "
                "flight), then exiting %d for a restart to resume",
                signal.Signals(signum).name,
                EXIT_PREEMPTED,
            )
        self.requested = True

    def honour(self, where: str) -> None:
        """A safe point between phases or parts (``where``: "before round 2/2's mining"): every rank learns
        whether any pod got SIGTERM, in one small collective, so all raise :class:`Preempted` together."""
        from trainer import distributed as D  # torch: the CLI imports this module before it reads the config

        if any(D.gather_objects(self.requested)):
            raise Preempted(where)

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
