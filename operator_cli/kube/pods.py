"""A job's pods as ``status`` shows them: node rank, phase, restarts, and one line on what is wrong."""

from __future__ import annotations

from dataclasses import dataclass

from operator_cli import constants as C

__all__ = ["PodInfo", "pod_rank", "pod_reason"]


@dataclass
class PodInfo:
    name: str
    replica: str  # master-0, worker-1, ...
    rank: int  # node rank: the pod index (Master 0, Worker i -> i+1; Worker i -> i in a job of Workers only)
    phase: str
    restarts: int
    reason: str | None  # why it is pending or failing, in one line


def pod_rank(pod, masterless: bool = False) -> tuple[str, int]:
    """(replica name, node rank). An elastic job's node ranks come from its rendezvous; its pods are
    numbered by their Worker index, which is what ``logs --rank`` selects."""
    labels = pod.metadata.labels or {}
    if C.JOBSET_NAME_LABEL in labels:  # a TrainJob's pod: node rank = the Job's completion index
        index = labels.get(C.JOB_COMPLETION_INDEX_LABEL)
        if index is None or not index.isdigit():
            parts = pod.metadata.name.split("-")  # <job>-node-0-<i>-<hash>
            index = parts[-2] if len(parts) >= 2 and parts[-2].isdigit() else "0"
        return f"node-{int(index)}", int(index)
    rtype = (labels.get(C.OPERATOR_REPLICA_TYPE) or "").lower()
    index = int(labels.get(C.OPERATOR_REPLICA_INDEX, "0") or 0)
    if not rtype:  # fall back to the operator's pod naming: <job>-master-0, <job>-worker-3
        parts = pod.metadata.name.rsplit("-", 2)
        rtype = parts[-2] if len(parts) == 3 else "pod"
        index = int(parts[-1]) if parts[-1].isdigit() else 0
    return f"{rtype}-{index}", (0 if rtype == "master" else index + (0 if masterless else 1))


def pod_reason(pod, events: list) -> str | None:
    """One line saying why a pod is not running well, from its statuses and its events."""
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
    warnings = [e for e in events if e.type == "Warning"]
    if warnings:
        last = warnings[-1]
        return f"{last.reason}: {(last.message or '').splitlines()[0]}"
    return None
