"""PyTorchJob (Kubeflow Training Operator v1.9.4): a Master and Workers, or, elastic, Workers only."""

from __future__ import annotations

import copy
from typing import Any

import operator_cli.kube.names as names
from operator_cli import constants as C
from operator_cli.errors import CliError
from operator_cli.jobshape import JobShape
from operator_cli.kube.kinds.base import JobKind, gpus_in, rederive_requests, set_gpus
from operator_cli.podplan import PodPlan, operator_policy

__all__ = ["PyTorchJob"]


class PyTorchJob(JobKind):
    """The Training Operator's job: one replica spec per role, pods named ``<job>-master-0``, ``<job>-worker-i``;
    the operator injects MASTER_ADDR/PORT, WORLD_SIZE and RANK besides torchrun's PET_* variables."""

    api = "pytorchjob"
    group = C.GROUP
    version = C.VERSION
    plural = C.PLURAL
    kind = C.KIND
    product = "the Kubeflow Training Operator"
    install = C.TRAINING_OPERATOR_INSTALL
    controller = ("kubeflow", "training-operator")
    pod_selector = C.OPERATOR_JOB_NAME
    container = C.CONTAINER
    template = "pytorchjob.yaml.j2"
    shape = {
        "spec.pytorchReplicaSpecs": dict,
        "spec.pytorchReplicaSpecs.*": dict,
        "spec.pytorchReplicaSpecs.*.template": dict,
        "spec.pytorchReplicaSpecs.*.template.spec": dict,
        "spec.pytorchReplicaSpecs.*.template.spec.containers": list,
        "spec.pytorchReplicaSpecs.*.template.spec.containers.*": dict,
    }

    def pod_names(self, spec: JobShape) -> list[str]:
        if spec.elastic:  # Workers only: the operator's rendezvous endpoint is <job>-worker-0
            return [names.pod(spec.name, f"worker-{i}") for i in range(max(spec.nodes, spec.elastic[1]))]
        return [names.pod(spec.name, "master-0")] + [names.pod(spec.name, f"worker-{i}") for i in range(spec.nodes - 1)]

    def nodes_and_gpus(self, job: dict[str, Any]) -> tuple[int, int]:
        replicas = job.get("spec", {}).get("pytorchReplicaSpecs", {})
        first = replicas.get("Master") or replicas.get("Worker") or {}  # an elastic job has Workers only
        containers = first.get("template", {}).get("spec", {}).get("containers", [{}])
        gpus = gpus_in(containers[0].get("resources", {}).get("limits", {}))
        return sum(r.get("replicas", 0) for r in replicas.values()), gpus

    def reshape(self, job: dict[str, Any], nodes: int, gpus: int) -> None:
        spec, nproc = job["spec"], max(1, gpus)
        replicas = spec["pytorchReplicaSpecs"]
        spec["nprocPerNode"] = str(nproc)
        if elastic := spec.get("elasticPolicy"):  # Workers only; torchrun reads the process count from the env
            low, high = elastic.get("minReplicas", 1), elastic.get("maxReplicas", nodes)
            if not low <= nodes <= high:
                raise CliError(
                    f"job {job['metadata']['name']} is elastic on {low}..{high} nodes; --nodes {nodes} is outside it",
                    hint="pick a node count within that range",
                )
            replicas["Worker"]["replicas"] = nodes
            for var in replicas["Worker"]["template"]["spec"]["containers"][0].get("env", []):
                if var["name"] == "PET_NPROC_PER_NODE":
                    var["value"] = str(nproc)
        elif nodes > 1:
            worker = replicas.get("Worker") or copy.deepcopy(replicas["Master"])
            labels = worker["template"].setdefault("metadata", {}).setdefault("labels", {})
            labels[C.LABEL_COMPONENT] = "worker"
            worker["replicas"] = nodes - 1
            replicas["Worker"] = worker
        else:
            replicas.pop("Worker", None)
        for replica in replicas.values():
            set_gpus(replica["template"]["spec"]["containers"][0], "resources", gpus)
            rederive_requests(replica["template"]["spec"]["containers"][0], "resources", gpus, job)

    def pod_rank(self, pod: Any, job: dict[str, Any]) -> tuple[str, int]:
        """Master 0, Worker i -> i+1; in a job of Workers only (elastic) Worker i -> i: its node ranks come from
        the rendezvous, and its pods are numbered by their Worker index, which is what ``logs --rank`` selects."""
        labels = pod.metadata.labels or {}
        rtype = (labels.get(C.OPERATOR_REPLICA_TYPE) or "").lower()
        index = int(labels.get(C.OPERATOR_REPLICA_INDEX, "0") or 0)
        if not rtype:  # fall back to the operator's pod naming: <job>-master-0, <job>-worker-3
            parts = pod.metadata.name.rsplit("-", 2)
            rtype = parts[-2] if len(parts) == 3 else "pod"
            index = int(parts[-1]) if parts[-1].isdigit() else 0
        masterless = "Master" not in (job.get("spec", {}).get("pytorchReplicaSpecs") or {"Master": None})
        return f"{rtype}-{index}", (0 if rtype == "master" else index + (0 if masterless else 1))

    def suspended(self, job: dict[str, Any]) -> bool:
        return bool(((job.get("spec") or {}).get("runPolicy") or {}).get("suspend"))

    def suspend_patch(self, suspend: bool) -> dict[str, Any]:
        return {"runPolicy": {"suspend": suspend}}

    def plan(self, job: dict[str, Any], objects: list[dict[str, Any]]) -> PodPlan:
        """Master + Workers; or, with ``elasticPolicy``, Workers only, every pod running torchrun's elastic agent
        (node ranks then come from the rendezvous)."""
        name = job["metadata"]["name"]
        spec = job["spec"]
        specs = spec["pytorchReplicaSpecs"]
        policy = spec.get("elasticPolicy")
        workers = int(specs.get("Worker", {}).get("replicas", 0))
        first = specs["Worker" if policy else "Master"]  # the pod template every replica shares
        replica_names = ([] if policy else ["master-0"]) + [f"worker-{i}" for i in range(workers)]
        backoff = int(spec.get("runPolicy", {}).get("backoffLimit", 0))
        elastic = (int(policy.get("minReplicas", workers)), int(policy.get("maxReplicas", workers))) if policy else None
        return PodPlan(
            kind=self,
            name=name,
            hosts=[names.pod(name, r) for r in replica_names],
            replica_names=replica_names,
            pod_spec=first["template"]["spec"],
            container=next(c for c in first["template"]["spec"]["containers"] if c["name"] == self.container),
            restart_policy=first.get("restartPolicy", "OnFailure"),
            backoff_limit=backoff,
            nproc=str(spec.get("nprocPerNode", "auto")),
            elastic=elastic,
            max_restarts=policy.get("maxRestarts") if policy else None,
            failure=operator_policy(first.get("restartPolicy", "OnFailure"), backoff),
        )

    def launcher_env(self, plan: PodPlan, index: int, master_addr: str, master_port: int) -> dict[str, str]:
        if plan.elastic:
            env = {
                "PYTHONUNBUFFERED": "1",
                "PET_RDZV_ENDPOINT": f"{master_addr}:{master_port}",
                "PET_RDZV_BACKEND": "c10d",
                "PET_NNODES": f"{plan.elastic[0]}:{plan.elastic[1]}",
                # On a cluster the agent whose host name is the endpoint's (worker-0) hosts the store; here
                # every replica's address is local, so which one hosts it is said outright.
                "PET_RDZV_CONF": f"is_host={'true' if index == 0 else 'false'}",
            }
            if plan.max_restarts is not None:
                env["PET_MAX_RESTARTS"] = str(plan.max_restarts)
            return env
        nproc = int(plan.nproc) if plan.nproc.isdigit() else 1
        return {
            "PYTHONUNBUFFERED": "1",
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "WORLD_SIZE": str(len(plan.hosts) * nproc),
            "RANK": str(index),
            **plan.torchrun_env(index, master_addr, master_port),
        }
