"""What a job kind is: :class:`JobKind`, the one base every job API this tool submits implements, and the
reads that are alike for all of them (a job's state, its claim, the shape of an API answer)."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from operator_cli import constants as C
from operator_cli.jobshape import JobShape
from operator_cli.podplan import PodPlan

__all__ = ["JobKind", "find_all", "gpus_in", "job_state", "set_gpus", "shape_problem", "workspace_claim"]


class JobKind(ABC):
    """One training-job API: where it lives, what it renders, and how a live job of it reads.

    Everything that differs between PyTorchJob and TrainJob is a method or a class attribute here, so the
    cluster code, ``resize``, ``local``, ``doctor`` and ``fetch`` ask the kind instead of testing for it.
    A new kind is one subclass (registered in :mod:`operator_cli.kube.kinds`), one template, and the chart."""

    api: ClassVar[str]  # the --api value, and the chart's ``api``
    group: ClassVar[str]
    version: ClassVar[str]
    plural: ClassVar[str]
    kind: ClassVar[str]
    product: ClassVar[str]  # what the user installs to serve it, for the one line when it is not there
    install: ClassVar[str]  # the command that installs it
    controller: ClassVar[tuple[str, str]]  # (namespace, Deployment) of its controller, for doctor
    pod_selector: ClassVar[str]  # the label whose value is the job's name on its pods
    container: ClassVar[str]  # the trainer's container in each pod (logs are read from it)
    template: ClassVar[str]  # its Jinja template in operator_cli/templates
    uses_runtime: ClassVar[bool] = False  # a TrainJob's pods come from a ClusterTrainingRuntime
    shape: ClassVar[dict[str, type]] = {}  # the fields this tool reads of a live job (see shape_problem)

    @property
    def crd(self) -> str:
        return f"{self.plural}.{self.group}"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def __repr__(self) -> str:
        return f"<JobKind {self.kind}>"

    # ---- the spec --------------------------------------------------------------------------------------
    def check_spec(self, spec: JobShape) -> None:  # noqa: B027 (a hook: most kinds take every spec)
        """What this API cannot express, refused in one line (JobSpec calls it on construction)."""

    @abstractmethod
    def pod_names(self, spec: JobShape) -> list[str]:
        """The pods' host names, in node-rank order, as the controller will name them."""

    # ---- a live job ------------------------------------------------------------------------------------
    @abstractmethod
    def nodes_and_gpus(self, job: dict[str, Any]) -> tuple[int, int]:
        """Pods, and GPUs (whole or MIG slices) per pod."""

    @abstractmethod
    def reshape(self, job: dict[str, Any], nodes: int, gpus: int) -> None:
        """Set a copy of a live job's spec to ``nodes`` pods of ``gpus`` GPUs, as the template would have."""

    def reshaped(self, job: dict[str, Any], nodes: int, gpus: int) -> dict[str, Any]:
        """The job as ``submit`` would have rendered it with the new shape, server fields dropped."""
        meta = job["metadata"]
        new = {
            "apiVersion": job["apiVersion"],
            "kind": job["kind"],
            "metadata": {k: meta[k] for k in ("name", "namespace", "labels", "annotations") if meta.get(k)},
            "spec": copy.deepcopy(job["spec"]),
        }
        self.reshape(new, nodes, gpus)
        return new

    @abstractmethod
    def pod_rank(self, pod: Any, job: dict[str, Any]) -> tuple[str, int]:
        """(replica name, node rank) of one of the job's pods (a ``V1Pod``)."""

    @abstractmethod
    def suspended(self, job: dict[str, Any]) -> bool:
        """Whether the job is suspended (its pods removed, the job kept)."""

    @abstractmethod
    def suspend_patch(self, suspend: bool) -> dict[str, Any]:
        """The merge patch of ``spec`` that suspends or resumes a job of this kind."""

    def image(self, job: dict[str, Any]) -> str | None:
        """The trainer's image, where the API keeps it outside a pod template (else: the first container's)."""
        return None

    # ---- local replay ----------------------------------------------------------------------------------
    @abstractmethod
    def plan(self, job: dict[str, Any], objects: list[dict[str, Any]]) -> PodPlan:
        """The pods the controller would run for ``job`` (``objects``: what was rendered with it)."""

    @abstractmethod
    def launcher_env(self, plan: PodPlan, index: int, master_addr: str, master_port: int) -> dict[str, str]:
        """The variables this API's controller injects into pod ``index``."""

    # ---- the API ---------------------------------------------------------------------------------------
    def create(self, custom: Any, namespace: str, obj: dict[str, Any], **query: Any) -> Any:
        """``query``: the API's create options, e.g. ``dry_run="All"`` (``submit --dry-run=server``)."""
        return custom.create_namespaced_custom_object(self.group, self.version, namespace, self.plural, obj, **query)

    def get(self, custom: Any, namespace: str, name: str) -> Any:
        return custom.get_namespaced_custom_object(self.group, self.version, namespace, self.plural, name)

    def delete(self, custom: Any, namespace: str, name: str) -> Any:
        return custom.delete_namespaced_custom_object(
            self.group, self.version, namespace, self.plural, name, propagation_policy="Foreground"
        )

    def patch(self, custom: Any, namespace: str, name: str, body: dict[str, Any]) -> Any:
        return custom.patch_namespaced_custom_object(self.group, self.version, namespace, self.plural, name, body)

    def list(self, custom: Any, namespace: str | None, selector: str, limit: int | None = None) -> Any:
        """Every namespace's when ``namespace`` is None."""
        extra = {k: v for k, v in (("label_selector", selector), ("limit", limit)) if v}
        if namespace is None:
            return custom.list_cluster_custom_object(self.group, self.version, self.plural, **extra)
        return custom.list_namespaced_custom_object(self.group, self.version, namespace, self.plural, **extra)


def gpus_in(limits: dict[str, Any]) -> int:
    """``nvidia.com/gpu`` or ``nvidia.com/mig-<profile>`` (``--mig``) in a container's limits.

    >>> gpus_in({"nvidia.com/gpu": 2, "cpu": "4"}), gpus_in({"nvidia.com/mig-1g.10gb": "1"}), gpus_in({})
    (2, 1, 0)
    """
    return sum(int(v or 0) for k, v in limits.items() if k == C.GPU_RESOURCE or k.startswith(C.MIG_RESOURCE_PREFIX))


def set_gpus(holder: dict[str, Any], key: str, gpus: int) -> None:
    """Whole GPUs in ``holder[key]`` (a container's ``resources``, a TrainJob's ``resourcesPerNode``), as the
    templates write them: for 0, no GPU, and no empty ``limits`` or resources left behind.

    >>> c = {"resources": {"limits": {"nvidia.com/gpu": 2}}}; set_gpus(c, "resources", 0); c
    {}
    """
    resources = holder.setdefault(key, {})
    limits = resources.setdefault("limits", {})
    if gpus:
        limits[C.GPU_RESOURCE] = gpus
    else:
        limits.pop(C.GPU_RESOURCE, None)
    if not limits:
        del resources["limits"]
    if not resources:
        del holder[key]


def rederive_requests(holder: dict[str, Any], key: str, gpus: int, job: dict[str, Any]) -> None:
    """The CPU and memory requests this tool derived from the GPUs (``operator_cli/resources.py``), derived
    again for the new GPU count, as ``render`` would; a request the user set (``--cpu``/``--memory``: request
    and limit both) stays as it is.

    >>> c = {"resources": {"requests": {"cpu": "32", "memory": "136Gi"}}}
    >>> rederive_requests(c, "resources", 0, {"volumes": [{"name": "dshm", "emptyDir": {"sizeLimit": "8Gi"}}]}); c
    {'resources': {'requests': {'cpu': '4', 'memory': '16Gi'}}}
    """
    from operator_cli.resources import default_cpu, default_memory

    resources = holder.get(key) or {}
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    if "cpu" in requests and "cpu" not in limits:
        requests["cpu"] = default_cpu(gpus)
    if "memory" in requests and "memory" not in limits:
        requests["memory"] = default_memory(gpus, _shm_size(job))


def _shm_size(tree: Any) -> str | None:
    """The ``dshm`` emptyDir's sizeLimit, wherever the job's pod template holds it."""
    if isinstance(tree, dict):
        if tree.get("name") == "dshm" and isinstance(tree.get("emptyDir"), dict):
            return tree["emptyDir"].get("sizeLimit")
        tree = list(tree.values())
    if isinstance(tree, list):
        for item in tree:
            if (found := _shm_size(item)) is not None:
                return found
    return None


# What this tool reads of any job, and the type each must have where present (each kind adds its own). A real
# API server checks these against the CRD's schema; an answer from anything else is refused in one line
# instead of failing deep in status, logs or resize. "*" is every value of a mapping or item of a list.
_SHAPE: dict[str, type] = {
    "metadata": dict,
    "metadata.labels": dict,
    "spec": dict,
    "status": dict,
    "status.conditions": list,
    "status.conditions.*": dict,
    "status.replicaStatuses": dict,
    "status.replicaStatuses.*": dict,
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


def shape_problem(job: Any, kinds: list[JobKind]) -> str | None:
    """The first field of a job answer that is not the type this tool reads it as, or None.

    >>> shape_problem({"spec": []}, []), shape_problem({"spec": {}}, [])
    ('spec is list, not an object', None)
    """
    if not isinstance(job, dict):
        return f"the job is {type(job).__name__}, not an object"
    shape = dict(_SHAPE)
    for kind in kinds:
        shape.update(kind.shape)
    for path, want in shape.items():
        for value in _values_at(job, path.split(".")):
            if not isinstance(value, want):
                return f"{path} is {type(value).__name__}, not {'an object' if want is dict else 'a list'}"
    return None


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
    differs (a PyTorchJob's replica specs, a TrainJob's runtime patches), the fields in it do not.

    >>> find_all({"a": {"volumes": [1]}, "b": [{"volumes": [2]}]}, "volumes")
    [[1], [2]]
    """
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
