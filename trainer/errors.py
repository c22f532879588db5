"""Errors the trainer reports as one line, importable without torch (``main`` catches them)."""

from __future__ import annotations

import re

__all__ = ["JobVerdict", "WeightsDiverged", "peer_failure"]

# What gloo and NCCL raise (as plain RuntimeError, or torch's DistError) when a peer vanished.
_PEER_GONE = re.compile(
    r"Connection (closed|reset) by peer|Broken pipe|Connection refused|NCCL (error|communicator was aborted)"
    r"|DistNetworkError|Timed out waiting|Socket Timeout|failed to recv|Watchdog caught collective",
    re.I,
)


class JobVerdict(Exception):
    """Raised by every rank at the same point, after a collective decided it (a checkpoint refused
    for the job, diverged weights, ranks of different shapes, a stop request). The ranks can then
    leave the process group together, as on success (``distributed.process_group``)."""


class WeightsDiverged(JobVerdict, RuntimeError):
    """Ranks hold different weights: continuing would average gradients of different models."""


def peer_failure(e: BaseException) -> str | None:
    """One line for a collective that failed because another rank died, else None (a real bug)."""
    text = str(e)
    if type(e).__name__.startswith("Dist") or _PEER_GONE.search(text):
        first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
        return (
            f"a peer left the job during a collective ({first[:200]}); exiting so the operator "
            "restarts the job from its newest checkpoint"
        )
    return None
