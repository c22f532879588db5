"""TrainJob (Kubeflow Trainer v2.3.0 on JobSet): ``numNodes`` pods of a ClusterTrainingRuntime's ``node`` job,
this tool's pod fields applied as a runtime patch."""

from __future__ import annotations

from typing import Any

import operator_cli.kube.names as names
from operator_cli import constants as C
from operator_cli.errors import CliError
from operator_cli.jobshape import JobShape
from operator_cli.kube.kinds.base import JobKind, gpus_in, rederive_requests, set_gpus
from operator_cli.podplan import FailurePolicy, PodPlan, code_ranges

__all__ = ["TrainJob", "runtime_policy"]


class TrainJob(JobKind):
    """Trainer v2's job: pods ``<job>-node-0-i`` of the JobSet it makes, reached as ``<host>.<job>``; only
    torchrun's PET_* variables are injected, and restarts are the runtime's (JobSet ``maxRestarts``)."""

    api = "trainjob"
    group = C.V2_GROUP
    version = C.V2_VERSION
    plural = C.V2_PLURAL
    kind = C.V2_KIND
    product = "Kubeflow Trainer v2"
    install = C.TRAINER_V2_INSTALL
    controller = ("kubeflow-system", "kubeflow-trainer-controller-manager")
    pod_selector = C.JOBSET_NAME_LABEL
    container = C.V2_CONTAINER
    template = "trainjob.yaml.j2"
    uses_runtime = True
    shape = {"spec.trainer": dict, "spec.runtimePatches": list, "spec.runtimePatches.*": dict}

    def check_spec(self, spec: JobShape) -> None:
        if spec.priority_class:
            raise CliError(
                "--priority-class cannot be set on a TrainJob (Trainer v2.3.0 lets a TrainJob patch no "
                "priorityClassName)",
                hint="use a ClusterTrainingRuntime whose pod template sets it (--runtime NAME), "
                "or Kueue's --label kueue.x-k8s.io/priority-class=NAME",
            )
        if spec.elastic is not None:
            raise CliError(
                f"--elastic {spec.elastic[0]}:{spec.elastic[1]}: a TrainJob (Kubeflow Trainer v2.3.0) has no elastic "
                "policy (KEP-2903 is a proposal)",
                hint="use --api pytorchjob: its elasticPolicy runs torchrun's elastic agents",
            )

    def pod_names(self, spec: JobShape) -> list[str]:
        return [names.pod(spec.name, f"{C.V2_REPLICATED_JOB}-0-{i}") for i in range(spec.nodes)]

    def nodes_and_gpus(self, job: dict[str, Any]) -> tuple[int, int]:
        trainer = job.get("spec", {}).get("trainer", {})
        gpus = gpus_in(trainer.get("resourcesPerNode", {}).get("limits", {}))
        return int(trainer.get("numNodes", 1) or 1), gpus

    def reshape(self, job: dict[str, Any], nodes: int, gpus: int) -> None:
        trainer = job["spec"]["trainer"]
        trainer["numNodes"], trainer["numProcPerNode"] = nodes, max(1, gpus)
        set_gpus(trainer, "resourcesPerNode", gpus)
        rederive_requests(trainer, "resourcesPerNode", gpus, job)

    def pod_rank(self, pod: Any, job: dict[str, Any]) -> tuple[str, int]:
        """The node rank is the JobSet Job's completion index (from the pod name, <job>-node-0-<i>-<hash>,
        where the label is missing)."""
        index = (pod.metadata.labels or {}).get(C.JOB_COMPLETION_INDEX_LABEL)
        if index is None or not index.isdigit():
            parts = pod.metadata.name.split("-")
            index = parts[-2] if len(parts) >= 2 and parts[-2].isdigit() else "0"
        return f"node-{int(index)}", int(index)

    def suspended(self, job: dict[str, Any]) -> bool:
        return bool((job.get("spec") or {}).get("suspend"))

    def suspend_patch(self, suspend: bool) -> dict[str, Any]:
        return {"suspend": suspend}

    def image(self, job: dict[str, Any]) -> str | None:
        return job.get("spec", {}).get("trainer", {}).get("image")

    def plan(self, job: dict[str, Any], objects: list[dict[str, Any]]) -> PodPlan:
        """The runtime's `node` job with this TrainJob's trainer fields and runtime patch applied; the runtime's
        failure policy when it is among ``objects``, else the stock runtime's (no rule: every failure restarts)."""
        name, trainer = job["metadata"]["name"], job["spec"]["trainer"]
        runtime_name = job["spec"].get("runtimeRef", {}).get("name", "?")
        runtimes = [o for o in objects if o["kind"] == C.V2_RUNTIME_KIND and o["metadata"]["name"] == runtime_name]
        runtime = runtimes[0] if runtimes else None
        patch = next(p for p in job["spec"].get("runtimePatches", []) if p.get("manager") == C.V2_PATCH_MANAGER)
        replicated = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        node = next(r for r in replicated if r["name"] == C.V2_REPLICATED_JOB)
        pod_spec = node["template"]["spec"]["template"]["spec"]
        patched = next(c for c in pod_spec["containers"] if c["name"] == self.container)
        container = {
            "name": self.container,
            "image": trainer["image"],
            "command": trainer.get("command", []),
            "args": trainer.get("args", []),
            "env": trainer.get("env", []),
            "resources": trainer.get("resourcesPerNode", {}),
            "workingDir": C.WORKSPACE_MOUNT,  # the image's WORKDIR: the runtime sets none, the image does
            **{k: v for k, v in patched.items() if k != "name"},
        }
        nodes = int(trainer.get("numNodes", 1))
        failure = runtime_policy(runtime or {})
        if runtime is None:
            note = f"runtime {runtime_name} is not known here: replaying the stock one's restarts (up to 3, any exit)"
        elif failure.permanent:
            note = (
                f"runtime {runtime_name}'s failure policy replayed ({failure.rule}; else {failure.restarts} restarts)"
            )
        else:
            note = f"runtime {runtime_name} has no failure policy: every failure restarts (up to {failure.restarts})"
        return PodPlan(
            kind=self,
            name=name,
            hosts=[names.pod(name, f"{C.V2_REPLICATED_JOB}-0-{i}") for i in range(nodes)],
            replica_names=[f"{C.V2_REPLICATED_JOB}-{i}" for i in range(nodes)],
            pod_spec=pod_spec,
            container=container,
            restart_policy="OnFailure",
            backoff_limit=failure.restarts,
            nproc=str(trainer.get("numProcPerNode", "auto")),
            failure=failure,
            runtime_note=note,
            domain=name,  # JobSet's headless service: pods resolve as <host>.<job>
            master_port=C.V2_MASTER_PORT,
            restart_limit="maxRestarts",
        )

    def launcher_env(self, plan: PodPlan, index: int, master_addr: str, master_port: int) -> dict[str, str]:
        return plan.torchrun_env(index, master_addr, master_port)


def runtime_policy(runtime: dict[str, Any]) -> FailurePolicy:
    """A ClusterTrainingRuntime's failure policy: the exit codes its ``node`` Job fails on with FailJob,
    when a JobSet rule turns a PodFailurePolicy failure into FailJobSet; ``maxRestarts`` for the rest. A
    runtime without a failurePolicy (the stock one) fails on no code at once; JobSet's default then
    restarts nothing, but its Job's pods restart in place, which ``local`` replays as 3 restarts."""
    spec = (runtime.get("spec") or {}).get("template", {}).get("spec", {}) or {}
    policy = spec.get("failurePolicy")
    if not policy:
        return FailurePolicy(restarts=3)
    fails_fast = any(
        r.get("action") == "FailJobSet" and "PodFailurePolicy" in (r.get("onJobFailureReasons") or [])
        for r in policy.get("rules") or []
    )
    codes: list[int] = []
    for job in spec.get("replicatedJobs") or []:
        if job.get("name") != C.V2_REPLICATED_JOB:
            continue
        for rule in ((job.get("template") or {}).get("spec", {}).get("podFailurePolicy") or {}).get("rules") or []:
            exits = rule.get("onExitCodes") or {}
            fails = rule.get("action") == "FailJob" and exits.get("operator") == "In"
            if fails and exits.get("containerName") in (None, C.V2_CONTAINER):
                codes += [int(v) for v in exits.get("values") or []]
    ranges = code_ranges(codes)
    listed = ", ".join(f"{low}-{high}" if high > low else str(low) for low, high in ranges)
    return FailurePolicy(
        restarts=int(policy.get("maxRestarts") or 0),
        permanent=ranges if fails_fast else (),
        recreates_pods=True,
        rule=f"podFailurePolicy FailJob on exit code(s) {listed} -> FailJobSet",
    )
