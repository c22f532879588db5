"""The two job APIs this tool submits (PyTorchJob v1, TrainJob v2), and a job's state read alike for both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from operator_cli import constants as C

__all__ = ["JobKind", "KINDS", "find_all", "kind_of", "job_state", "masterless", "shape_problem", "workspace_claim"]


@dataclass(frozen=True)
class JobKind:
    """One training-job API: where it lives and how its pods are found."""

    api: str
    group: str
    version: str
    plural: str
    kind: str
    crd: str
    install: str
    pod_selector: str  # label whose value is the job name on its pods
    container: str  # the trainer's container in each pod (logs are read from it)

    def nodes_and_gpus(self, job: dict[str, Any]) -> tuple[int, int]:
        """Pods and GPUs (whole or MIG slices) per pod."""
        spec = job.get("spec", {})
        if self.api == "trainjob":
            trainer = spec.get("trainer", {})
            gpus = _gpus(trainer.get("resourcesPerNode", {}).get("limits", {}))
            return int(trainer.get("numNodes", 1) or 1), gpus
        replicas = spec.get("pytorchReplicaSpecs", {})
        first = replicas.get("Master") or replicas.get("Worker") or {}  # an elastic job has Workers only
        containers = first.get("template", {}).get("spec", {}).get("containers", [{}])
        gpus = _gpus(containers[0].get("resources", {}).get("limits", {}))
        return sum(r.get("replicas", 0) for r in replicas.values()), gpus


def _gpus(limits: dict[str, Any]) -> int:
    """``nvidia.com/gpu`` or ``nvidia.com/mig-<profile>`` (``--mig``) in a container's limits."""
    return sum(int(v or 0) for k, v in limits.items() if k == C.GPU_RESOURCE or k.startswith(C.MIG_RESOURCE_PREFIX))


# What this tool reads of a job, and the type each must have where present. A real API server checks these
# against the CRD's schema; an answer from anything else is refused in one line instead of failing deep
# in status, logs or resize. "*" is every value of a mapping or item of a list.
_SHAPE: dict[str, type] = {
    "metadata": dict,
    "metadata.labels": dict,
    "spec": dict,
    "status": dict,
    "status.conditions": list,
    "status.conditions.*": dict,
    "status.replicaStatuses": dict,
    "status.replicaStatuses.*": dict,
    "spec.pytorchReplicaSpecs": dict,
    "spec.pytorchReplicaSpecs.*": dict,
    "spec.pytorchReplicaSpecs.*.template": dict,
    "spec.pytorchReplicaSpecs.*.template.spec": dict,
    "spec.pytorchReplicaSpecs.*.template.spec.containers": list,
    "spec.pytorchReplicaSpecs.*.template.spec.containers.*": dict,
    "spec.trainer": dict,
    "spec.runtimePatches": list,
    "spec.runtimePatches.*": dict,
}


def _values_at(obj: Any, path: list[str]) -> list[Any]:
    if not path:
        return [obj]
    head, rest = path[0], path[1:]
    if head == "*":
        items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list) else []
        return [v for item in items for v in _values_at(item, rest)]
    if not isinstance(obj, dict) or obj.get(head) is None:
        return []
    return _values_at(obj[head], rest)


def shape_problem(job: Any) -> str | None:
    """The first field of a job answer that is not the type this tool reads it as, or None."""
    if not isinstance(job, dict):
        return f"the job is {type(job).__name__}, not an object"
    for path, kind in _SHAPE.items():
        for value in _values_at(job, path.split(".")):
            if not isinstance(value, kind):
                return f"{path} is {type(value).__name__}, not {'an object' if kind is dict else 'a list'}"
    return None


KINDS = {
    "pytorchjob": JobKind(
        "pytorchjob",
        C.GROUP,
        C.VERSION,
        C.PLURAL,
        C.KIND,
        C.CRD_NAME,
        C.TRAINING_OPERATOR_INSTALL,
        C.OPERATOR_JOB_NAME,
        C.CONTAINER,
    ),
    "trainjob": JobKind(
        "trainjob",
        C.V2_GROUP,
        C.V2_VERSION,
        C.V2_PLURAL,
        C.V2_KIND,
        C.V2_CRD_NAME,
        C.TRAINER_V2_INSTALL,
        C.JOBSET_NAME_LABEL,
        C.V2_CONTAINER,
    ),
}


def kind_of(job: dict[str, Any]) -> JobKind:
    return KINDS["trainjob"] if job.get("kind") == C.V2_KIND else KINDS["pytorchjob"]


def masterless(job: dict[str, Any]) -> bool:
    """A PyTorchJob of Workers only (an elastic one): its pods count from worker-0 = 0, not Master = 0."""
    replicas = job.get("spec", {}).get("pytorchReplicaSpecs")
    return bool(replicas) and "Master" not in replicas


def job_state(job: dict[str, Any]) -> str:
    """The newest true condition: Created, Running, Restarting, Suspended, Succeeded or Failed.

    A TrainJob's ``Complete`` is shown as ``Succeeded``, so both APIs read the same."""
    conditions = [c for c in job.get("status", {}).get("conditions", []) or [] if c.get("status") == "True"]
    types = [("Succeeded" if c.get("type") == "Complete" else c.get("type")) for c in conditions]
    for final in ("Succeeded", "Failed"):
        if final in types:
            return final
    return types[-1] if types else "Pending"


def find_all(obj: Any, key: str) -> list[Any]:
    """Every value of ``key`` anywhere in ``obj``, outermost first: where each API keeps its pod template
    differs (a PyTorchJob's replica specs, a TrainJob's runtime patches), the fields in it do not."""
    found = []
    if isinstance(obj, dict):
        for k, value in obj.items():
            found += [value] if k == key else find_all(value, key)
    elif isinstance(obj, list):
        for item in obj:
            found += find_all(item, key)
    return found


def workspace_claim(job: dict[str, Any]) -> str | None:
    """The claim mounted at /workspace, or None when it is a per-pod emptyDir (``--pod-local-storage``)."""
    volumes = [v for found in find_all(job.get("spec", {}), "volumes") if isinstance(found, list) for v in found]
    workspace = next((v for v in volumes if isinstance(v, dict) and v.get("name") == "workspace"), {})
    return (workspace.get("persistentVolumeClaim") or {}).get("claimName")
