"""Each job option, declared once: :data:`JOB_OPTIONS`, the table behind both the CLI's options
(``render``, ``submit``, ``local``) and :class:`operator_cli.spec.JobSpec`'s validation.

An :class:`Option` holds what click needs (flag, help, type, metavar, choices) and what the spec checks
(its field and its rule, with the words of the one-line error). Defaults are :class:`JobSpec`'s fields', read
by the CLI for ``--help``; choices come from their sources (the job kinds, the NCCL presets). Rules that
involve several options or the job's kind are :class:`JobSpec`'s own. No click here: the spec is built by
the chart tests and the benches too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from operator_cli import constants as C
from operator_cli import rules
from operator_cli.durations import seconds
from operator_cli.errors import CliError
from operator_cli.kube.kinds import API_CHOICES, AUTO_ORDER, KINDS
from operator_cli.values import (
    NCCL_PRESETS,
    parse_elastic,
    parse_pairs,
    parse_secret_envs,
    parse_toleration,
    shown,
)

__all__ = ["INT32_MAX", "INT64_MAX", "JOB_OPTIONS", "Option"]

INT32_MAX = 2**31 - 1  # backoffLimit, ttlSecondsAfterFinished are int32 in the API
INT64_MAX = 2**63 - 1  # activeDeadlineSeconds is int64


@dataclass(frozen=True)
class Option:
    """One job option: its flag and help for click, its :class:`JobSpec` field, and the rule its value meets."""

    flag: str
    help: str = ""
    field: str | None = None
    """The JobSpec field it sets; None: the flag's name (``--gpus-per-node`` -> ``gpus_per_node``)."""
    type: type = str
    short: str | None = None
    metavar: str | None = None
    multiple: bool = False
    is_flag: bool = False
    show_default: bool = False  # a default to show in --help: the JobSpec field's
    file: bool = False  # a path to a file (click.Path(dir_okay=False))
    required: bool = False
    choices: tuple[str, ...] = ()
    parse: Callable[[Any], Any] | None = None
    """The flag's value -> the field's (``K=V`` pairs -> a dict); None: as given."""
    rule: Callable[[Any], bool] | None = None
    """True for a good value (each item of a list); a bad one is ``{flag} {must}, got {value}``."""
    must: str = ""
    checker: Callable[[Any, str], None] | None = None
    """For a mapping: ``checker(value, flag)`` raises its own line for a bad key or value."""

    @property
    def key(self) -> str:
        """The name click gives the value: ``--gpus-per-node`` -> ``gpus_per_node``."""
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def spec_field(self) -> str:
        return self.field or self.key

    def check(self, value: Any) -> None:
        """Refuse a value that breaks the rule, in one line (None: not given, nothing to check)."""
        if value is None:
            return
        if self.checker is not None:
            self.checker(value, self.flag)
        if self.rule is None:
            return
        for item in value if isinstance(value, list) else [value]:
            if not self.rule(item):
                raise CliError(f"{self.flag} {self.must}, got {shown(item) if isinstance(item, str) else item}")


def _full(kind: str) -> Callable[[Any], bool]:
    return lambda value: rules.full(kind, value)


def _within(low: int, high: int) -> Callable[[Any], bool]:
    """A whole number in range; anything else (a duration's text that reached the spec unparsed) breaks it."""
    return lambda value: isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _labels(labels: dict[str, str], flag: str) -> None:
    for key, value in labels.items():
        if not rules.full("qualified_name", key):
            raise CliError(f"{flag} key must be a label key like example.com/name, got {shown(key)}")
        if not rules.full("label_value", value):
            raise CliError(
                f"{flag} value for {key} must be a label value (<= 63 of [A-Za-z0-9-_.]), got {shown(value)}"
            )


def _annotations(annotations: dict[str, str], flag: str) -> None:
    for key, value in annotations.items():
        if not rules.full("qualified_name", key):
            raise CliError(f"{flag} key must be a qualified name like example.com/key, got {shown(key)}")
        if rules.has_control_chars(value):
            raise CliError(f"{flag} {key}: the value holds control characters; remove them")


def _env(env: dict[str, str], flag: str) -> None:
    for var in env:
        if not rules.full("env_name", var):
            raise CliError(f"{flag} name must be a valid environment variable name, got {shown(var)}")
        if rules.reserved_env(var):
            raise CliError(f"{flag} {var} is set by the Training Operator or this tool; remove it")
        if rules.credential_like(var):
            raise CliError(
                f"{flag} {var}=... looks like a credential and would be written into the manifest in clear",
                hint=f"store it in a Secret and pass --secret-env {var}=SECRET_NAME/KEY",
            )


def _duration(flag: str) -> Callable[[Any], int]:
    """A duration in kubectl's form (``10m``, ``1h30m``; a bare number is seconds) as whole seconds."""
    return lambda value: int(round(seconds(value, flag)))


def _pairs(flag: str) -> Callable[[Any], dict[str, str]]:
    return lambda values: parse_pairs(values, flag)


DNS1123 = "must be a DNS-1123 name"
QUANTITY = "must be a Kubernetes quantity like 4, 500m or 32Gi"
API_RANGE = "(the API field's range)"

JOB_OPTIONS: tuple[Option, ...] = (
    Option(
        "--config", "Training YAML (validated before anything is sent).", field="config_text", file=True, required=True
    ),
    Option(
        "--name",
        "Job name (DNS-1035). Default: colbert-<hash>, from the config and the options, so the "
        "same job renders the same name.",
        rule=_full("dns1035"),
        must="must be a DNS-1035 label (lowercase letters, digits, '-', starting with a letter)",
    ),
    Option(
        "--namespace",
        "Default: the kubeconfig context's namespace, else 'default'.",
        short="-n",
        rule=_full("dns1123_label"),
        must="must be a DNS-1123 label (at most 63 of a-z, 0-9, '-')",
    ),
    Option(
        "--nodes",
        "Pods: 1 Master + (nodes-1) Workers. Default: 1, or MAX with --elastic.",
        type=int,
        rule=_within(1, C.MAX_NODES),
        must=f"must be between 1 and {C.MAX_NODES}",
    ),
    Option(
        "--elastic",
        "Elastic PyTorchJob: train on any MIN..MAX nodes; a lost node's survivors go on from the "
        "newest checkpoint (needs a PVC and training.global_batch_size).",
        metavar="MIN:MAX",
        parse=parse_elastic,
    ),
    Option(
        "--gpus-per-node",
        "GPUs and processes per pod; 0 = CPU job, 1 process per pod.",
        type=int,
        show_default=True,
        rule=_within(0, C.MAX_GPUS_PER_NODE),
        must=f"must be between 0 and {C.MAX_GPUS_PER_NODE}",
    ),
    Option(
        "--image",
        "The trainer image (built from this repository's Dockerfile).",
        show_default=True,
        rule=_full("image"),
        must="must be an image reference like REGISTRY/NAME:TAG",
    ),
    Option(
        "--cpu",
        "CPU request and limit per pod, e.g. 8. Default: a request of 4 per GPU (4 for a CPU job).",
        rule=_full("quantity"),
        must=QUANTITY,
    ),
    Option(
        "--memory",
        "Memory request and limit per pod, e.g. 64Gi; it must exceed --shm-size. Default: a request "
        "of 16Gi per GPU (8Gi for a CPU job) plus --shm-size.",
        rule=_full("quantity"),
        must=QUANTITY,
    ),
    Option(
        "--shm-size",
        "Memory-backed /dev/shm size (it counts against the pod's memory); 0 disables it.",
        show_default=True,
        parse=lambda v: None if v in ("0", "") else v,
        rule=_full("quantity"),
        must=QUANTITY,
    ),
    Option(
        "--pvc",
        "Existing PersistentVolumeClaim mounted at /workspace (data, checkpoints, model).",
        rule=_full("dns1123"),
        must=DNS1123,
    ),
    Option("--pvc-size", "Create a PVC of this size for /workspace instead.", rule=_full("quantity"), must=QUANTITY),
    Option("--storage-class", "StorageClass of the PVC created by --pvc-size.", rule=_full("dns1123"), must=DNS1123),
    Option(
        "--pod-local-storage",
        "With --nodes > 1 and no PVC: each pod keeps its own emptyDir /workspace; "
        "a deleted master pod then restarts the job from step 0.",
        is_flag=True,
    ),
    Option(
        "--termination-grace-period",
        "Time from SIGTERM (eviction, preemption) to SIGKILL, e.g. 2m; the trainer checkpoints in it.",
        field="termination_grace",
        show_default=True,
        parse=_duration("--termination-grace-period"),
        rule=_within(0, 24 * 3600),
        must="must be 0..86400 seconds (24h)",
    ),
    Option(
        "--node-selector",
        "Node label the pods must match (repeatable), e.g. nvidia.com/gpu.product=H100.",
        metavar="K=V",
        multiple=True,
        parse=_pairs("--node-selector"),
        checker=_labels,
    ),
    Option(
        "--toleration",
        "Tolerate a node taint (repeatable), e.g. nvidia.com/gpu:NoSchedule; without =VALUE "
        "it tolerates any value (Exists).",
        metavar="KEY[=VALUE]:EFFECT",
        multiple=True,
        field="tolerations",
        parse=lambda values: [parse_toleration(t) for t in values],
    ),
    Option(
        "--priority-class",
        "PriorityClass of the pods. A TrainJob cannot set one: its runtime does (`runtime "
        "install --priority-class`), or --label kueue.x-k8s.io/priority-class=NAME.",
        rule=_full("dns1123"),
        must=DNS1123,
    ),
    Option(
        "--queue",
        "Kueue LocalQueue (label kueue.x-k8s.io/queue-name).",
        rule=_full("label_value"),
        must="must be a valid label value",
    ),
    Option(
        "--service-account",
        "An existing ServiceAccount the pods run as (e.g. bound to a cloud role for "
        "object-store access: workload identity).",
        rule=_full("dns1123"),
        must=DNS1123,
    ),
    Option(
        "--image-pull-secret",
        "A docker-registry Secret for pulling --image (repeatable).",
        multiple=True,
        field="image_pull_secrets",
        parse=list,
        rule=_full("dns1123"),
        must=DNS1123,
    ),
    Option(
        "--env",
        "Plain environment variable (never a credential).",
        metavar="K=V",
        multiple=True,
        parse=_pairs("--env"),
        checker=_env,
    ),
    Option(
        "--secret-env",
        "Variable from a Secret key (secretKeyRef).",
        metavar="VAR=SECRET/KEY",
        multiple=True,
        parse=parse_secret_envs,
    ),
    Option(
        "--backoff-limit",
        "Restarts before the job fails.",
        type=int,
        show_default=True,
        rule=_within(0, INT32_MAX),
        must=f"must be between 0 and {INT32_MAX} {API_RANGE}",
    ),
    Option(
        "--active-deadline",
        "How long a running job may run before it is stopped, e.g. 48h (seconds shown); 0 = never.",
        show_default=True,
        parse=lambda v: _duration("--active-deadline")(v) or None,
        rule=_within(0, INT64_MAX),
        must=f"must be between 0 and {INT64_MAX} seconds {API_RANGE}",
    ),
    Option(
        "--ttl-after-finished",
        "How long a finished job is kept, e.g. 24h (seconds shown).",
        show_default=True,
        parse=_duration("--ttl-after-finished"),
        rule=_within(0, INT32_MAX),
        must=f"must be between 0 and {INT32_MAX} seconds {API_RANGE}",
    ),
    Option(
        "--nccl",
        "NCCL network preset (GPU jobs); ib also asks for an RDMA device (--rdma-resource) and the "
        "IPC_LOCK capability.",
        choices=tuple(NCCL_PRESETS),
        rule=lambda v: v in NCCL_PRESETS,
        must=f"must be one of {sorted(NCCL_PRESETS)}",
    ),
    Option(
        "--rdma-resource",
        "The RDMA device resource --nccl ib asks one of per pod, as the cluster's device "
        "plugin names it (e.g. nvidia.com/hostdev); none: ask for no device.",
        show_default=True,
        parse=lambda v: None if v in ("none", "") else v,
        rule=_full("qualified_name"),
        must="must be an extended resource name like rdma/ib, or none",
    ),
    Option(
        "--api",
        " or ".join(f"{k.kind} ({k.product})" for k in KINDS.values()) + "; auto (submit only): the "
        f"first the cluster serves of {', '.join(AUTO_ORDER)}.",
        choices=API_CHOICES,
        show_default=True,
        rule=lambda v: v in KINDS,
        must=f"must be one of {', '.join(KINDS)}",
    ),
    Option(
        "--runtime",
        f"The ClusterTrainingRuntime a TrainJob uses (--api trainjob). Default: {C.V2_SHIPPED_RUNTIME} "
        f"(`colbert-k8s runtime install`); submit falls back to the stock {C.V2_STOCK_RUNTIME} without it.",
        rule=_full("dns1123"),
        must="must be a ClusterTrainingRuntime name (DNS-1123)",
    ),
    Option(
        "--label",
        "Extra label on every object and pod (repeatable).",
        metavar="K=V",
        multiple=True,
        field="labels",
        parse=_pairs("--label"),
        checker=_labels,
    ),
    Option(
        "--annotation",
        "Extra annotation on every object and pod (repeatable); never a credential.",
        metavar="K=V",
        multiple=True,
        field="annotations",
        parse=_pairs("--annotation"),
        checker=_annotations,
    ),
    # scheduling on shared clusters: their rules are operator_cli/scheduling.py's (they involve each other)
    Option(
        "--topology-required",
        "Kueue topology-aware scheduling: all pods in one domain of this node label "
        "(e.g. cloud.google.com/gce-topology-block), or wait.",
        metavar="LEVEL",
    ),
    Option("--topology-preferred", "Kueue: pack the pods into as few domains of LEVEL as it can.", metavar="LEVEL"),
    Option(
        "--mig",
        "One MIG slice per pod (e.g. 1g.10gb): nvidia.com/mig-PROFILE instead of nvidia.com/gpu.",
        metavar="PROFILE",
    ),
)
