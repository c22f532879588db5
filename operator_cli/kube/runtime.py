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

from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Protocol

from operator_cli import constants as C
from operator_cli import rules
from operator_cli.errors import CliError
from operator_cli.kube.kinds.trainjob import runtime_policy
from operator_cli.options import JOB_OPTIONS, Option
from operator_cli.render import render_one
from operator_cli.values import NCCL_PRESETS
from trainer.errors import PERMANENT_EXIT_CODES

__all__ = [
    "RUNTIME_OPTIONS",
    "RuntimeSpec",
    "check_runtime",
    "dry_run_note",
    "install_runtime",
    "known_runtime",
    "read_runtime",
    "render_runtime",
    "runtime_health",
    "runtime_or_stock",
    "runtime_policy",
]

_JOB = {o.flag: o for o in JOB_OPTIONS}
RUNTIME_OPTIONS: tuple[Option, ...] = (
    Option(
        "--name",
        "The ClusterTrainingRuntime's name.",
        show_default=True,
        rule=lambda v: rules.full("dns1123", v) and len(v) <= 253,
        must="must be a DNS-1123 name for a ClusterTrainingRuntime",
    ),
    _JOB["--image"],
    Option(
        "--max-restarts",
        "JobSet restarts for retryable failures (lost peer, preemption) before the job fails.",
        type=int,
        show_default=True,
        rule=lambda v: 0 <= v <= C.MAX_RUNTIME_RESTARTS,
        must=f"must be between 0 and {C.MAX_RUNTIME_RESTARTS}",
    ),
    *(_JOB[flag] for flag in ("--nccl", "--shm-size", "--priority-class", "--termination-grace-period")),
)
"""``runtime render|install``'s options: its own two, and the job options the pod template shares with a job's
(declared once, in :data:`operator_cli.options.JOB_OPTIONS`: the same help, the same rule)."""


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
        for option in RUNTIME_OPTIONS:  # whoever builds it (the CLI, the tests): each option's own rule
            option.check(getattr(self, option.spec_field))

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Each field's default, for the CLI's options (which show them in --help)."""
        return {f.name: f.default for f in fields(cls) if f.default is not MISSING}

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


def known_runtime(name: str, image: str = C.DEFAULT_IMAGE) -> dict[str, Any] | None:
    """The runtime ``local`` can replay without a cluster: this tool's (rendered as ``runtime install`` would
    install it under that name) or the stock one (no failure policy); None for any other name."""
    if name == C.V2_STOCK_RUNTIME:
        return {
            "apiVersion": f"{C.V2_GROUP}/{C.V2_VERSION}",
            "kind": C.V2_RUNTIME_KIND,
            "metadata": {"name": name, "labels": {C.V2_FRAMEWORK_LABEL: "torch"}},
            "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}},
        }
    if name == C.V2_SHIPPED_RUNTIME:
        return render_runtime(RuntimeSpec(name=name, image=image))
    return None


# ---- the workflow on a cluster: check, fall back to the stock runtime, warn, install ------------------------


class _Api(Protocol):
    """What this module asks of :class:`operator_cli.kube.cluster.Cluster` (whose preflight calls
    :func:`check_runtime`, so it is described here rather than imported)."""

    custom: Any

    def read(
        self, fn: Callable[[], Any], verb: str, kind: str, name: str | None = None, namespace: str | None = ""
    ) -> dict[str, Any] | None: ...

    def request(
        self, fn: Callable[[], Any], verb: str, kind: str, name: str | None = None, namespace: str | None = ""
    ) -> Any: ...


_ARGS = (C.V2_GROUP, C.V2_VERSION, C.V2_RUNTIME_PLURAL)


def read_runtime(cluster: _Api, name: str) -> dict[str, Any] | None:
    """The ClusterTrainingRuntime ``name``; None when it is not there. A 403 is one line."""
    return cluster.read(
        lambda: cluster.custom.get_cluster_custom_object(*_ARGS, name), "get", C.V2_RUNTIME_KIND, name, namespace=None
    )


def check_runtime(cluster: _Api, name: str) -> None:
    """The ClusterTrainingRuntime exists and runs torch (its framework label or its mlPolicy)."""
    try:
        runtime = read_runtime(cluster, name)
    except CliError as e:
        if e.status == 403:
            return  # may create TrainJobs without reading runtimes: the controller will tell
        raise
    if runtime is None:
        raise CliError(
            f"ClusterTrainingRuntime {name!r} does not exist",
            hint=f"`colbert-k8s runtime install` installs {C.V2_SHIPPED_RUNTIME}; the stock one is "
            f"{C.V2_STOCK_RUNTIME} ({C.TRAINER_V2_INSTALL})",
            status=404,
        )
    labels = (runtime.get("metadata") or {}).get("labels") or {}
    policy = (runtime.get("spec") or {}).get("mlPolicy") or {}
    framework = labels.get(C.V2_FRAMEWORK_LABEL)
    if framework != "torch" and "torch" not in policy:
        raise CliError(
            f"ClusterTrainingRuntime {name!r} is for {framework or 'another framework'}, not torch "
            "(colbert-train is started by torchrun)",
            hint=f"pick a torch runtime, e.g. --runtime {C.V2_SHIPPED_RUNTIME} (`colbert-k8s runtime install`)",
        )


_STOCK_COST = (
    f"the stock {C.V2_STOCK_RUNTIME}, which retries a permanent error (a bad config or data row, a traceback: exit "
    "1-127) until its restarts run out instead of failing at once"
)


def dry_run_note(name: str) -> str:
    """``submit --dry-run`` without ``--runtime``: which runtime it names, and what a real submit may do instead."""
    return f"runtime: {name} (submit uses the stock {C.V2_STOCK_RUNTIME} where the cluster lacks it)"


def runtime_or_stock(cluster: _Api, name: str) -> tuple[str, str | None]:
    """``--runtime`` not given: ``name`` (this tool's) when the cluster has it, else the stock one and the
    warning that says what that costs."""
    if read_runtime(cluster, name) is not None:
        return name, None
    return C.V2_STOCK_RUNTIME, (
        f"ClusterTrainingRuntime {name} is not installed: using {_STOCK_COST}; `colbert-k8s runtime install` "
        "installs it"
    )


def runtime_health(cluster: _Api) -> tuple[str, str, str]:
    """``doctor``'s (status, line, hint): this tool's runtime (fails fast on exit 1-127) if it is there, else
    the stock one that submit falls back to (WARN), else FAIL."""
    if read_runtime(cluster, C.V2_SHIPPED_RUNTIME) is not None:
        check_runtime(cluster, C.V2_SHIPPED_RUNTIME)
        line = f"ClusterTrainingRuntime {C.V2_SHIPPED_RUNTIME} runs torch and fails a TrainJob at once on a permanent"
        return "OK", f"{line} exit code", ""
    try:
        check_runtime(cluster, C.V2_STOCK_RUNTIME)
    except CliError as e:
        if e.status in (None, 404):
            return "FAIL", e.message, e.hint or ""
        raise
    line = f"no ClusterTrainingRuntime {C.V2_SHIPPED_RUNTIME}: TrainJobs use the stock {C.V2_STOCK_RUNTIME}, which"
    return (
        "WARN",
        f"{line} retries a permanent error (a bad config or data row) until its restarts run out",
        ("colbert-k8s runtime install"),
    )


def install_runtime(cluster: _Api, runtime: dict[str, Any]) -> str:
    """Create the runtime, or replace it when this tool made the one of that name; returns what it did.

    A same-named runtime without this tool's labels (the stock one, an admin's) is left alone, in one line."""
    name = runtime["metadata"]["name"]
    found = read_runtime(cluster, name)
    if found is None:
        create = lambda: cluster.custom.create_cluster_custom_object(*_ARGS, runtime)
        cluster.request(create, "create", C.V2_RUNTIME_KIND, name, namespace=None)
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
    replace = lambda: cluster.custom.replace_cluster_custom_object(*_ARGS, name, body)
    cluster.request(replace, "replace", C.V2_RUNTIME_KIND, name, namespace=None)
    return "updated"
