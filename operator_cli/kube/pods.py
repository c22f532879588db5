"""A job's pods as ``status`` shows them (each kind numbers its own: ``JobKind.pod_rank``): phase, restarts,
and one line on what is wrong."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PodInfo", "pod_reason", "status_reason", "warning_reason"]


@dataclass
class PodInfo:
    name: str
    replica: str  # master-0, worker-1, ...
    rank: int  # node rank: the pod index (Master 0, Worker i -> i+1; Worker i -> i in a job of Workers only)
    phase: str
    restarts: int
    reason: str | None  # why it is pending or failing, in one line


def pod_reason(pod, events: list) -> str | None:
    """One line saying why a pod is not running well, from its statuses and its events."""
    return status_reason(pod) or warning_reason(events)


def status_reason(pod) -> str | None:
    """Why a pod is not running well, as its container statuses and conditions say; None when they do not."""
    status = pod.status
    for cs in (status.container_statuses or []) if status else []:
        if (
            cs.state
            and cs.state.waiting
            and cs.state.waiting.reason not in (None, "ContainerCreating", "PodInitializing")
        ):
            msg = cs.state.waiting.message or ""
            return f"{cs.state.waiting.reason}: {msg}".strip(": ").splitlines()[0]
        if cs.state and cs.state.terminated and cs.state.terminated.reason not in (None, "Completed"):
            return f"{cs.state.terminated.reason} (exit code {cs.state.terminated.exit_code})"
        if cs.last_state and cs.last_state.terminated and cs.last_state.terminated.reason == "OOMKilled":
            return f"OOMKilled (restarted {cs.restart_count}x): raise --memory or lower the batch size"
    for cond in (status.conditions or []) if status else []:
        if cond.type == "PodScheduled" and cond.status == "False":
            message = (cond.message or "").splitlines()[0] if cond.message else ""
            return f"{cond.reason or 'Unschedulable'}: {message}".strip(": ")
    return None


def warning_reason(events: list) -> str | None:
    """The newest Warning among a pod's events (oldest first), in one line."""
    warnings = [e for e in events if e.type == "Warning"]
    if warnings:
        last = warnings[-1]
        return f"{last.reason}: {(last.message or '').splitlines()[0]}"
    return None
