"""The ClusterTrainingRuntime this image ships (``colbert-k8s runtime render|install``): fail fast on 1-127.

Kubeflow Trainer v2 takes a TrainJob's restarts from its runtime's JobSet, and a TrainJob cannot set them
(its ``runtimePatches`` reach only the pod template: v2.3.0's CRD). The stock ``torch-distributed`` runtime
sets no failure policy, so a bad config or data row (the trainer's exit 2, ``trainer/errors.py``) or a
traceback (1) is run again and again until the restarts are spent. This runtime says what the exit codes
mean, by the one rule PyTorchJob's ``restartPolicy: ExitCode`` applies too (``PERMANENT_EXIT_CODES``):

* **Job** (the ``node`` replicated job): ``podFailurePolicy`` ``FailJob`` when the ``node`` container exits
  with a permanent code (1-127, listed by ``onExitCodes`` ``In``: the API takes up to 255 values, ordered,
  no 0), ``backoffLimit: 0`` so that any other pod failure fails its Job too, and ``restartPolicy: Never``
  (the API server refuses a podFailurePolicy with ``OnFailure``);
* **JobSet** ``failurePolicy``: ``FailJobSet`` on ``onJobFailureReasons: [PodFailurePolicy]``, otherwise
  ``RestartJobSet`` (a lost peer 129, SIGTERM 143, a SIGKILL) within ``maxRestarts``; a restart recreates
  the Jobs, and the trainer resumes from its newest checkpoint. A restart makes new pods, so a job whose
  ``/workspace`` is an ``emptyDir`` starts over: use a claim (``--pvc``/``--pvc-size``).

The pod template is written by the jobs' own partials (``templates/_pod.j2``): the restricted security
context, the termination grace period, ``/dev/shm``, the NCCL preset. Per-job pieces (config, workspace,
env, resources, scheduling) stay in each TrainJob's ``spec.trainer`` and runtime patch.

**Which JobSet fields Trainer accepts.** Trainer v2.3.0's ClusterTrainingRuntime CRD
(``../shared/crds``, JobSet v0.12 types) carries ``failurePolicy`` (``maxRestarts``, ``restartStrategy``
Recreate|BlockingRecreate|InPlaceRestart, ``rules`` with ``onJobFailureReasons``,
``onJobFailureMessagePatterns`` and ``targetReplicatedJobs``; actions FailJobSet, RestartJobSet,
RestartJobSetAndIgnoreMaxRestarts, RestartJob, RestartJobAndIgnoreMaxRestarts) and the Job's
``podFailurePolicy``, ``backoffLimit`` and pod ``restartPolicy``; Trainer's master after v2.3 (the v2.4
line) keeps the same JobSet v0.12 types, and v2.4.0 limits a runtime's replicated-job names to 20
characters (``node`` fits). Only fields both accept are used here: ``maxRestarts``, two rules with
``onJobFailureReasons``/``targetReplicatedJobs``, and the Job's podFailurePolicy on exit codes. The
default ``restartStrategy`` (Recreate) is left implicit, so a release without InPlaceRestart reads it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from operator_cli import constants as C
from operator_cli import rules
from operator_cli.errors import CliError
from operator_cli.podplan import FailurePolicy, code_ranges
from operator_cli.render import render_one
from operator_cli.values import NCCL_PRESETS, shown
from trainer.errors import PERMANENT_EXIT_CODES

__all__ = ["RuntimeSpec", "known_runtime", "render_runtime", "install_runtime", "runtime_policy"]


@dataclass(frozen=True)
class RuntimeSpec:
    """What ``runtime render`` takes; the attribute names are JobSpec's, so the pod partials read both."""

    name: str = C.V2_SHIPPED_RUNTIME
    image: str = C.DEFAULT_IMAGE
    """The default image of TrainJobs that use this runtime (each TrainJob sets its own in spec.trainer)."""
    max_restarts: int = 3
    """JobSet restarts for retryable failures (a lost peer, preemption) before the TrainJob fails."""
    nccl: str | None = None
    shm_size: str | None = "8Gi"
    priority_class: str | None = None
    """A PriorityClass for every pod: the way to prioritise TrainJobs, which cannot set one themselves."""
    termination_grace: int = C.TERMINATION_GRACE_SECONDS
    labels: dict[str, str] = field(default_factory=dict)
    # pod fields a runtime leaves to each job (its runtime patch)
    service_account: None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, str]] = field(default_factory=list)
    image_pull_secrets: list[str] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not rules.full("dns1123", self.name) or len(self.name) > 253:
            raise CliError(f"--name must be a DNS-1123 name for a ClusterTrainingRuntime, got {shown(self.name)}")
        if not rules.full("image", self.image):
            raise CliError(f"--image must be an image reference like REGISTRY/NAME:TAG, got {shown(self.image)}")
        if not 0 <= self.max_restarts <= C.MAX_RUNTIME_RESTARTS:
            raise CliError(f"--max-restarts must be between 0 and {C.MAX_RUNTIME_RESTARTS}, got {self.max_restarts}")
        if self.shm_size is not None and not rules.full("quantity", self.shm_size):
            raise CliError(f"--shm-size must be a Kubernetes quantity like 8Gi, got {shown(self.shm_size)}")
        if self.nccl is not None and self.nccl not in NCCL_PRESETS:
            raise CliError(f"--nccl must be one of {sorted(NCCL_PRESETS)}, got {shown(self.nccl)}")
        if self.priority_class is not None and not rules.full("dns1123", self.priority_class):
            raise CliError(f"--priority-class must be a DNS-1123 name, got {shown(self.priority_class)}")
        if not 0 <= self.termination_grace <= 24 * 3600:
            raise CliError(f"--termination-grace-period must be 0..86400 seconds, got {self.termination_grace}")

    @property
    def nccl_env(self) -> dict[str, str]:
        return NCCL_PRESETS[self.nccl] if self.nccl else {}

    @property
    def permanent_exit_codes(self) -> list[int]:
        """The trainer's permanent exit codes (``trainer/errors.py``): a restart would meet the same input."""
        low, high = PERMANENT_EXIT_CODES
        return list(range(low, high + 1))

    @property
    def pod_annotations(self) -> dict[str, str]:
        return {"sidecar.istio.io/inject": "false"}


def render_runtime(spec: RuntimeSpec) -> dict[str, Any]:
    """The ClusterTrainingRuntime as a dict (pure: ``runtime render`` prints it, ``install`` sends it)."""
    return render_one("runtime.yaml.j2", spec)


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
            if (rule.get("action") == "FailJob" and exits.get("operator") == "In"
                    and exits.get("containerName") in (None, C.V2_CONTAINER)):  # fmt: skip
                codes += [int(v) for v in exits.get("values") or []]
    ranges = code_ranges(codes)
    listed = ", ".join(f"{low}-{high}" if high > low else str(low) for low, high in ranges)
    return FailurePolicy(
        restarts=int(policy.get("maxRestarts") or 0),
        permanent=ranges if fails_fast else (),
        recreates_pods=True,
        rule=f"podFailurePolicy FailJob on exit code(s) {listed} -> FailJobSet",
    )


def known_runtime(name: str, image: str = C.DEFAULT_IMAGE) -> dict[str, Any] | None:
    """The runtime ``local`` can replay without a cluster: this tool's (rendered as ``runtime install`` would
    install it under that name) or the stock one (no failure policy); None for any other name."""
    if name == C.V2_STOCK_RUNTIME:
        return {"apiVersion": f"{C.V2_GROUP}/{C.V2_VERSION}", "kind": C.V2_RUNTIME_KIND,
                "metadata": {"name": name, "labels": {C.V2_FRAMEWORK_LABEL: "torch"}},
                "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}}}  # fmt: skip
    if name == C.V2_SHIPPED_RUNTIME:
        return render_runtime(RuntimeSpec(name=name, image=image))
    return None


def install_runtime(cluster, runtime: dict[str, Any]) -> str:
    """Create the runtime, or replace it when this tool made the one of that name; returns what it did.

    A same-named runtime without this tool's labels (the stock one, an admin's) is left alone, in one line."""
    name = runtime["metadata"]["name"]
    found = cluster.runtime(name)
    if found is None:
        cluster.put_runtime(runtime, replace=False)
        return "created"
    labels = (found.get("metadata") or {}).get("labels") or {}
    if labels.get(C.LABEL_MANAGED_BY) != C.MANAGED_BY or labels.get(C.LABEL_INSTANCE) != name:
        raise CliError(
            f"ClusterTrainingRuntime {name} exists and was not created by colbert-k8s "
            f"(no {C.LABEL_MANAGED_BY}={C.MANAGED_BY} label); not touching it",
            hint="install under another name (--name) and submit with --runtime NAME",
            exit_code=1,
        )
    body = {**runtime, "metadata": {**runtime["metadata"], "resourceVersion": found["metadata"].get("resourceVersion")}}
    if body["metadata"]["resourceVersion"] is None:
        del body["metadata"]["resourceVersion"]
    cluster.put_runtime(body, replace=True)
    return "updated"
