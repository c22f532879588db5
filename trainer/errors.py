"""Errors the trainer reports as one line, importable without torch (``main`` catches them)."""

from __future__ import annotations

import errno
import os
import re
import shutil

__all__ = [
    "EXIT_CONFIG",
    "EXIT_PEER",
    "EXIT_EXPORT",
    "EXIT_DIR_ENV",
    "PERMANENT_EXIT_CODES",
    "JobVerdict",
    "DiskFull",
    "NO_SPACE",
    "no_space",
    "NonFinite",
    "PhaseNotWhole",
    "WeightsDiverged",
    "is_permanent",
    "job_exit_code",
    "peer_failure",
]

# The exit-code rule, written here once: 1-127 are permanent (the job fails at once: a restart would meet the
# same config, row or bug), 128-255 and signals are retryable (a restart resumes from the newest checkpoint).
# It is the Training Operator's own `restartPolicy: ExitCode` rule, which a PyTorchJob cannot change; the
# `colbert-torch` runtime's podFailurePolicy lists these codes (operator_cli/kube/runtime.py) and
# `colbert-k8s local` replays both from here (operator_cli/podplan.py). A traceback is 1: permanent everywhere.
PERMANENT_EXIT_CODES = (1, 127)  # inclusive
EXIT_CONFIG = 2  # a bad config, data row, checkpoint of another job, launch environment: permanent
EXIT_PEER = 129  # a peer died or froze, a collective failed, ranks diverged: retryable from the checkpoint
# (SIGTERM's checkpoint-and-stop is 143 = 128 + SIGTERM, trainer/run/preemption.py: retryable as well.)
EXIT_EXPORT = 150  # the export failed after its retries: retryable; the model is safe, a restart exports again
EXIT_DIR_ENV = "COLBERT_K8S_EXIT_DIR"  # where torchrun's children leave their codes for the launcher

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


class NonFinite(JobVerdict):
    """The loss or gradient of a step is NaN or infinite: stopped before the update, so no weight, checkpoint
    or final model holds it. Permanent (exit 2): a restart would meet the same rows at the same step."""


class PhaseNotWhole(JobVerdict):
    """A phase just written does not verify against its manifest (trainer/phases.py): the job is not marked
    done. Retryable (129): the restart redoes that phase."""


NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


class DiskFull(JobVerdict):
    """A write failed for want of space (or a read-only volume): one line naming the path, the bytes needed
    and free; exit 2 at once (the temporary files are gone; a restart resumes once there is space)."""

    @classmethod
    def of(cls, e: OSError, path, need: int | None = None) -> DiskFull:
        try:
            free = shutil.disk_usage(path if os.path.isdir(path) else os.path.dirname(path) or ".").free
        except OSError:
            free = None
        what = "is read-only" if e.errno == errno.EROFS else "has no space left"
        sizes = [f"about {need:,} bytes needed"] if need else []
        sizes += [f"{free:,} free"] if free is not None else []
        sizes = ", ".join(sizes)
        return cls(
            f"{path}: the volume {what} ({e.strerror}{'; ' + sizes if sizes else ''}); nothing half-written was "
            "kept: free space or grow the volume (or set checkpoint.keep_last lower), then restart to resume"
        )


def no_space(e: BaseException) -> OSError | None:
    """The full-disk (or read-only) OSError behind ``e``, else None. Writers wrap it: torch.save's in a
    RuntimeError, pyarrow's and safetensors' in their own errors, some with the errno only in the text.

    >>> no_space(RuntimeError("write failed")) is None
    True
    >>> no_space(OSError(errno.ENOSPC, "No space left on device")).errno == errno.ENOSPC
    True
    >>> no_space(ValueError("IOError: No space left on device (os error 28)")).errno == errno.ENOSPC
    True
    """
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in NO_SPACE:
            return e
        if "No space left on device" in str(e) or "Disk quota exceeded" in str(e):
            code = errno.EDQUOT if "quota" in str(e) else errno.ENOSPC
            return OSError(code, os.strerror(code), getattr(e, "filename", None))
        e = e.__cause__ or e.__context__
    return None


class WeightsDiverged(JobVerdict, RuntimeError):
    """Ranks hold different weights: continuing would average gradients of different models."""


def peer_failure(e: BaseException) -> str | None:
    """One line for a collective that failed because another rank died, else None (a real bug)."""
    text = str(e)
    if type(e).__name__.startswith("Dist") or _PEER_GONE.search(text):
        first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
        return (
            f"a peer left the job during a collective ({first[:200]}); exiting so the operator "
            "(or, in an elastic job, torchrun's agent) restarts the job from its newest checkpoint"
        )
    return None


def is_permanent(code: int) -> bool:
    """Whether exit ``code`` fails the job at once (``Popen.returncode``: a negative one is a signal: retryable).

    >>> [is_permanent(c) for c in (0, 1, 2, 127, 128, 129, 143, -9)]
    [False, True, True, True, False, False, False, False]
    """
    low, high = PERMANENT_EXIT_CODES
    return low <= code <= high


def job_exit_code(torchrun_code: int, child_codes: list[int]) -> int:
    """The code a pod reports when torchrun ran its processes: torchrun itself says 1 for any failure.

    A permanent code of any child wins (it is the cause; its peers then fail on the broken collective
    with a retryable one); else the worst retryable one. Every child that Python ends says its code, a
    traceback's 1 included (``trainer/cli.main``); only a child killed before it could (OOM, SIGKILL) says
    none, and counts as retryable."""
    if torchrun_code == 0:
        return 0
    permanent = sorted(c for c in child_codes if is_permanent(c))
    if permanent:
        return permanent[0]
    retryable = [c for c in child_codes if c > PERMANENT_EXIT_CODES[1]]
    return max(retryable) if retryable else EXIT_PEER
