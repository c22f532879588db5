"""What the cluster would run for a rendered job: pod host names, the trainer container, the pod spec,
and the launcher's environment, for a PyTorchJob (Training Operator v1.9.4) or a TrainJob (Trainer
v2.3.0 on JobSet). ``colbert-k8s local`` replays this plan; it is read from the manifest, never from
the options, so the replay runs exactly what was rendered.

The environment each launcher injects (see ``shared/crds/PROVENANCE.md``):

==============  ===============================================================  ====================
API             variables                                                        master
==============  ===============================================================  ====================
PyTorchJob      MASTER_ADDR/PORT, WORLD_SIZE (= pods x nproc), RANK (= pod       ``<job>-master-0``,
                index), PET_MASTER_ADDR/PORT, PET_NNODES, PET_NPROC_PER_NODE,    the container port
                PET_NODE_RANK, PYTHONUNBUFFERED                                  (23456)
TrainJob        PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR,  ``<job>-node-0-0.<job>``,
                PET_MASTER_PORT only                                             29500
elastic         (Workers only) PET_RDZV_ENDPOINT, PET_RDZV_BACKEND=c10d,         ``<job>-worker-0``, the
PyTorchJob      PET_NNODES=MIN:MAX, PET_MAX_RESTARTS; no MASTER_*, RANK,         container port; its
                WORLD_SIZE or PET_NPROC_PER_NODE (the manifest sets the last)    agent hosts the store
==============  ===============================================================  ====================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from operator_cli import constants as C

__all__ = ["FailurePolicy", "PodPlan", "plan_pods"]


@dataclass(frozen=True)
class FailurePolicy:
    """What a job's controller does when a replica fails, as ``colbert-k8s local`` replays it."""

    restarts: int
    """Restarts of the whole job before it fails (PyTorchJob ``backoffLimit``, JobSet ``maxRestarts``)."""
    permanent: tuple[tuple[int, int], ...] = ()
    """Inclusive exit-code ranges that fail the job at once, whatever restarts are left."""
    recreates_pods: bool = False
    """True when a restart makes new pods (JobSet Recreate, restartPolicy Never): emptyDirs start empty."""
    rule: str = ""
    """The manifest's words for the permanent rule, for the one line that reports it."""

    def is_permanent(self, code: int) -> bool:
        """``code`` as ``Popen.returncode`` (negative: a signal, never permanent).

        >>> FailurePolicy(3, ((2, 2),)).is_permanent(2), FailurePolicy(3, ((2, 2),)).is_permanent(-9)
        (True, False)
        """
        return any(low <= code <= high for low, high in self.permanent)


def _operator_policy(restart_policy: str, backoff_limit: int) -> FailurePolicy:
    """The Training Operator's rule for a PyTorchJob replica: ``ExitCode`` fails the job at once on 1-127 (the
    trainer's permanent failures) and restarts on 128-255 and signals; ``OnFailure`` restarts on any failure;
    ``Never`` on none; all within ``runPolicy.backoffLimit``."""
    if restart_policy == "Never":
        return FailurePolicy(restarts=0)
    if restart_policy == "ExitCode":
        return FailurePolicy(backoff_limit, ((1, 127),), rule="restartPolicy ExitCode (1-127)")
    return FailurePolicy(backoff_limit)


@dataclass(frozen=True)
class PodPlan:
    kind: str  # PyTorchJob or TrainJob
    name: str
    hosts: list[str]  # one per pod, in node-rank order
    replica_names: list[str]  # master-0, worker-0 ... or node-0, node-1 ...
    pod_spec: dict[str, Any]
    container: dict[str, Any]  # command, args, env, workingDir, resources of the trainer container
    restart_policy: str
    backoff_limit: int
    nproc: str  # as the launcher passes it (PET_NPROC_PER_NODE)
    elastic: tuple[int, int] | None = None  # elasticPolicy's (minReplicas, maxReplicas)
    max_restarts: int | None = None  # elasticPolicy.maxRestarts: torchrun's worker-group restarts
    failure: FailurePolicy = FailurePolicy(restarts=0)  # what the controller does when a replica fails
    runtime_note: str = ""  # a TrainJob's runtime as local knows it, for the "not honoured" line

    @property
    def v2(self) -> bool:
        return self.kind == C.V2_KIND

    def master(self, isolated_network: bool, free_port: int) -> tuple[str, int]:
        """The rendezvous address: the launcher's host name and port where names resolve (network
        namespaces with /etc/hosts), else loopback and a free port (several jobs may run here)."""
        if not isolated_network:
            return "127.0.0.1", free_port
        if self.v2:
            return f"{self.hosts[0]}.{self.name}", C.V2_MASTER_PORT
        return self.hosts[0], free_port

    def launcher_env(self, index: int, master_addr: str, master_port: int) -> dict[str, str]:
        if self.elastic:
            env = {
                "PYTHONUNBUFFERED": "1",
                "PET_RDZV_ENDPOINT": f"{master_addr}:{master_port}",
                "PET_RDZV_BACKEND": "c10d",
                "PET_NNODES": f"{self.elastic[0]}:{self.elastic[1]}",
                # On a cluster the agent whose host name is the endpoint's (worker-0) hosts the store; here
                # every replica's address is local, so which one hosts it is said outright.
                "PET_RDZV_CONF": f"is_host={'true' if index == 0 else 'false'}",
            }
            if self.max_restarts is not None:
                env["PET_MAX_RESTARTS"] = str(self.max_restarts)
            return env
        pet = {
            "PET_MASTER_ADDR": master_addr,
            "PET_MASTER_PORT": str(master_port),
            "PET_NNODES": str(len(self.hosts)),
            "PET_NPROC_PER_NODE": self.nproc,
            "PET_NODE_RANK": str(index),
        }
        if self.v2:
            return pet
        nproc = int(self.nproc) if self.nproc.isdigit() else 1
        return {
            "PYTHONUNBUFFERED": "1",
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "WORLD_SIZE": str(len(self.hosts) * nproc),
            "RANK": str(index),
            **pet,
        }


def plan_pods(objects: list[dict[str, Any]]) -> PodPlan:
    """The plan of the job among ``objects``; a TrainJob's ClusterTrainingRuntime may be among them too
    (``local`` adds the ones it knows, :func:`operator_cli.kube.runtime.known_runtime`)."""
    job = next(o for o in objects if o["kind"] in (C.KIND, C.V2_KIND))
    if job["kind"] != C.V2_KIND:
        return _pytorchjob(job)
    name = job["spec"].get("runtimeRef", {}).get("name")
    runtimes = [o for o in objects if o["kind"] == C.V2_RUNTIME_KIND and o["metadata"]["name"] == name]
    return _trainjob(job, runtimes[0] if runtimes else None)


def _pytorchjob(job: dict[str, Any]) -> PodPlan:
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
    return PodPlan(
        kind=C.KIND,
        name=name,
        hosts=[f"{name}-{r}" for r in replica_names],
        replica_names=replica_names,
        pod_spec=first["template"]["spec"],
        container=next(c for c in first["template"]["spec"]["containers"] if c["name"] == C.CONTAINER),
        restart_policy=first.get("restartPolicy", "OnFailure"),
        backoff_limit=backoff,
        nproc=str(spec.get("nprocPerNode", "auto")),
        elastic=(int(policy.get("minReplicas", workers)), int(policy.get("maxReplicas", workers))) if policy else None,
        max_restarts=policy.get("maxRestarts") if policy else None,
        failure=_operator_policy(first.get("restartPolicy", "OnFailure"), backoff),
    )


def _trainjob(job: dict[str, Any], runtime: dict[str, Any] | None) -> PodPlan:
    """The runtime's `node` job with this TrainJob's trainer fields and runtime patch applied; the runtime's
    failure policy when it is known, else the stock runtime's (no rule: every failure restarts)."""
    from operator_cli.kube.runtime import runtime_policy

    name = job["metadata"]["name"]
    trainer = job["spec"]["trainer"]
    patch = next(p for p in job["spec"].get("runtimePatches", []) if p.get("manager") == C.V2_PATCH_MANAGER)
    node = next(
        r
        for r in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        if r["name"] == C.V2_REPLICATED_JOB
    )
    pod_spec = node["template"]["spec"]["template"]["spec"]
    patched = next(c for c in pod_spec["containers"] if c["name"] == C.V2_CONTAINER)
    container = {
        "name": C.V2_CONTAINER,
        "image": trainer["image"],
        "command": trainer.get("command", []),
        "args": trainer.get("args", []),
        "env": trainer.get("env", []),
        "resources": trainer.get("resourcesPerNode", {}),
        "workingDir": C.WORKSPACE_MOUNT,  # the image's WORKDIR: the runtime sets none, the image does
        **{k: v for k, v in patched.items() if k != "name"},
    }
    nodes = int(trainer.get("numNodes", 1))
    runtime_name = job["spec"].get("runtimeRef", {}).get("name", "?")
    failure = runtime_policy(runtime) if runtime else runtime_policy({})
    if runtime is None:
        note = f"runtime {runtime_name} is not known here: replaying the stock one's restarts (up to 3, any exit)"
    elif failure.permanent:
        note = f"runtime {runtime_name}'s failure policy replayed ({failure.rule}; else {failure.restarts} restarts)"
    else:
        note = f"runtime {runtime_name} has no failure policy: every failure restarts (up to {failure.restarts})"
    return PodPlan(
        kind=C.V2_KIND,
        name=name,
        hosts=[f"{name}-node-0-{i}" for i in range(nodes)],
        replica_names=[f"node-{i}" for i in range(nodes)],
        pod_spec=pod_spec,
        container=container,
        restart_policy="OnFailure",
        backoff_limit=failure.restarts,
        nproc=str(trainer.get("numProcPerNode", "auto")),
        failure=failure,
        runtime_note=note,
    )
