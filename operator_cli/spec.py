"""The typed job spec: every option of ``submit``/``render``/``local``, declared once and validated on construction.

:data:`JOB_OPTIONS` is the one table of the job's options: each :class:`Option` names its flag, its help, its
:class:`JobSpec` field and the rule its value must meet. The CLI's options are made from it
(:func:`operator_cli.commands.job.job_options`), and :meth:`JobSpec.__post_init__` checks every rule in it,
whoever builds the spec (the CLI, the chart tests, the benches). Each check raises :class:`CliError` with a
message of the form "``--flag`` must ..., got ``value``"; what involves several options, or the job's kind
(:meth:`operator_cli.kube.kinds.JobKind.check_spec`), is checked after the table.

Secret *values* never pass through here: ``--secret-env`` takes a Secret name and key, and ``--env`` refuses
names that look like credentials. Flags' text is parsed by :mod:`operator_cli.values`.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import operator_cli.kube.names as names
from operator_cli import resources, scheduling
from operator_cli.constants import (
    DEFAULT_IMAGE,
    OWN_LABELS,
    RDMA_CAPABILITY,
    RDMA_RESOURCE,
    TERMINATION_GRACE_SECONDS,
    V2_DEFAULT_RUNTIME,
)
from operator_cli.errors import CliError
from operator_cli.kube.kinds import DEFAULT_API, KINDS, JobKind
from operator_cli.options import INT32_MAX, INT64_MAX, JOB_OPTIONS, Option
from operator_cli.values import (
    NCCL_PRESETS,
    SecretRef,
    generate_name,
    parse_elastic,
    parse_pairs,
    parse_secret_env,
    parse_secret_envs,
    parse_toleration,
    shown,
)
from trainer.config.credentials import credential_in

__all__ = [
    "INT32_MAX",
    "INT64_MAX",
    "JOB_OPTIONS",
    "JobSpec",
    "NCCL_PRESETS",
    "OWN_LABELS",
    "Option",
    "check_shape",
    "SecretRef",
    "parse_pairs",
    "parse_toleration",
    "parse_secret_env",
    "parse_secret_envs",
    "parse_elastic",
    "generate_name",
    "shown",
    "read_config",
    "parse_training_config",
]

_BY_FIELD: dict[str, Option] = {o.spec_field: o for o in JOB_OPTIONS}


def check_shape(nodes: int, gpus_per_node: int | None) -> None:
    """``--nodes`` and ``--gpus-per-node`` within this tool's bounds (``gpus_per_node`` None: unchanged)."""
    _BY_FIELD["nodes"].check(nodes)
    if gpus_per_node is not None:
        _BY_FIELD["gpus_per_node"].check(gpus_per_node)


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


@dataclass(frozen=True)
class JobSpec:
    """A validated training job: every value a manifest needs, checked on construction."""

    name: str
    config_text: str
    """The training YAML, validated by the trainer's own schema, shipped in a ConfigMap."""
    namespace: str = "default"
    nodes: int = 1
    """Pods (Master + Workers); each runs ``gpus_per_node`` processes."""
    gpus_per_node: int = 1
    """GPUs per pod; 0 runs one CPU process per pod."""
    image: str = DEFAULT_IMAGE
    cpu: str | None = None
    memory: str | None = None
    shm_size: str | None = "8Gi"
    """Size of the memory-backed /dev/shm (NCCL and data loaders need more than the 64Mi default)."""
    pvc: str | None = None
    pvc_size: str | None = None
    pod_local_storage: bool = False
    """With --nodes > 1 and no PVC: accept that each pod's /workspace is its own emptyDir."""
    termination_grace: int = TERMINATION_GRACE_SECONDS
    """Seconds between SIGTERM and SIGKILL: the trainer checkpoints the last completed step in them."""
    storage_class: str | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, str]] = field(default_factory=list)
    priority_class: str | None = None
    queue: str | None = None
    service_account: str | None = None
    image_pull_secrets: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    secret_env: dict[str, SecretRef] = field(default_factory=dict)
    backoff_limit: int = 3
    active_deadline: int | None = 7 * 24 * 3600
    """Seconds before a running job is stopped (default 7 days; 0 = never)."""
    ttl_after_finished: int | None = 24 * 3600
    nccl: str | None = None
    rdma_resource: str | None = RDMA_RESOURCE
    """The RDMA device resource ``--nccl ib`` asks one of per pod (None: none)."""
    api: str = DEFAULT_API
    """The job's kind, by its --api name (operator_cli.kube.kinds.KINDS): pytorchjob, trainjob."""
    runtime: str = V2_DEFAULT_RUNTIME
    """The ClusterTrainingRuntime a TrainJob references (trainjob only)."""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    elastic: tuple[int, int] | None = None
    """(MIN, MAX) nodes: a PyTorchJob ``elasticPolicy``; torchrun's agents re-form the group on MIN..MAX nodes."""
    topology_required: str | None = None
    """A node label key (a topology level): Kueue admits the job only where all its pods fit in one such domain."""
    topology_preferred: str | None = None
    """A node label key: Kueue packs the pods into as few such domains as it can."""
    mig: str | None = None
    """A MIG profile (1g.10gb): each pod asks for ``nvidia.com/mig-<profile>`` slices instead of whole GPUs."""

    def __post_init__(self) -> None:
        self._refuse_credentials()
        for option in JOB_OPTIONS:  # each option's own rule, in the table's order
            option.check(getattr(self, option.spec_field))
        longest = self.pod_names[-1]
        if len(longest) > 63:
            raise CliError(f"--name {shown(self.name)} is too long: pod name {longest!r} would exceed 63 characters")
        self._check_storage()
        self._check_env()
        for key in self.labels.keys() & OWN_LABELS:
            raise CliError(
                f"--label {key} is set by colbert-k8s itself (status, logs, list and delete find their jobs by it); "
                "use another key"
            )
        if self.nccl and self.gpus_per_node == 0:
            raise CliError("--nccl applies to GPU jobs only; drop it or set --gpus-per-node")
        resources.check_shm(self.shm_size, self.memory)
        self.kind.check_spec(self)
        self._check_elastic()
        self._check_export()
        scheduling.check(self)

    def _check_storage(self) -> None:
        if self.pvc and self.pvc_size:
            raise CliError("--pvc and --pvc-size exclude each other: use an existing claim or create one")
        if self.nodes > 1 and not (self.pvc or self.pvc_size or self.pod_local_storage):
            raise CliError(
                f"--nodes {self.nodes} without shared storage: checkpoints would live only in the master pod's "
                "emptyDir, and a job whose master pod is deleted would start over from step 0",
                hint="add --pvc-size 50Gi (a new ReadWriteMany claim) or --pvc NAME, "
                "or --pod-local-storage to accept that",
            )
        if self.pod_local_storage and (self.pvc or self.pvc_size):
            raise CliError("--pod-local-storage excludes --pvc and --pvc-size: keep one")

    def _check_env(self) -> None:
        preset = NCCL_PRESETS.get(self.nccl or "", {})
        for var in self.env:
            if var in self.secret_env:
                raise CliError(f"{var} is given by both --env and --secret-env; keep one")
            if var in preset:
                raise CliError(f"--env {var} is also set by --nccl {self.nccl}; drop one of them")

    @property
    def kind(self) -> JobKind:
        """The job's kind (``--api``), which renders it and knows its pods."""
        return KINDS[self.api]

    @property
    def names(self) -> names.JobNames:
        """The names of the job's objects, as the templates write them."""
        return names.JobNames(job=self.name, claim=self.claim_name, pods=tuple(self.pod_names))

    @property
    def gpu_resource(self) -> str:
        """The extended resource each GPU process asks for: a whole GPU, or one MIG slice of ``--mig``."""
        return scheduling.gpu_resource(self.mig)

    @property
    def resource_limits(self) -> dict[str, str | int]:
        """The trainer container's limits: GPUs, the RDMA device of ``--nccl ib``, and ``--cpu``/``--memory``
        when given (:mod:`operator_cli.resources`)."""
        limits: dict[str, str | int] = {self.gpu_resource: self.gpus_per_node} if self.gpus_per_node else {}
        if self.nccl == "ib" and self.rdma_resource:
            limits[self.rdma_resource] = 1
        limits.update({k: v for k, v in (("cpu", self.cpu), ("memory", self.memory)) if v})
        return limits

    @property
    def resource_requests(self) -> dict[str, str]:
        """CPU and memory requests on every pod: given, or derived from ``--gpus-per-node`` and ``--shm-size``."""
        return {
            "cpu": self.cpu or resources.default_cpu(self.gpus_per_node),
            "memory": self.memory or resources.default_memory(self.gpus_per_node, self.shm_size),
        }

    @property
    def capabilities_add(self) -> list[str]:
        """Capabilities added back after dropping ALL: IPC_LOCK for InfiniBand (NCCL pins its buffers)."""
        return [RDMA_CAPABILITY] if self.nccl == "ib" else []

    @property
    def topology_annotations(self) -> dict[str, str]:
        """Kueue's pod-set topology request, on every pod template."""
        return scheduling.topology_annotations(self.topology_required, self.topology_preferred)

    @property
    def pod_annotations(self) -> dict[str, str]:
        """Annotations of the pod templates (``--annotation`` is added to them by the templates)."""
        return {"sidecar.istio.io/inject": "false", **self.topology_annotations}

    def _check_elastic(self) -> None:
        """An elastic job must resume on any node count in MIN..MAX: shared checkpoints, one mathematics."""
        if self.elastic is None:
            return
        low, high = self.elastic
        flag = f"--elastic {low}:{high}"
        if not low <= self.nodes <= high:
            raise CliError(f"{flag}: --nodes {self.nodes} (the pods asked for at start) must be within {low}..{high}")
        if not self.claim_name:
            raise CliError(
                f"{flag} needs shared storage: a group re-formed without a node must find that node's checkpoints",
                hint="add --pvc-size 50Gi (a new ReadWriteMany claim) or --pvc NAME",
            )
        from trainer.config.schema import ConfigError  # pydantic: kept out of the CLI's import
        from trainer.scale import micro_batches

        cfg = self.train_config
        if cfg.training.global_batch_size is None:
            raise CliError(
                f"{flag} needs training.global_batch_size in the config: it fixes the batch, and so the "
                "mathematics, on every node count",
                hint="set training.global_batch_size to per_device_batch_size x the processes you train on now",
            )
        for nodes in range(low, high + 1):
            try:
                micro_batches(cfg, nodes * self.nproc_per_node)
            except ConfigError as e:
                raise CliError(f"{flag}: {nodes} node(s) x {self.nproc_per_node} process(es): {e}") from None

    def _check_export(self) -> None:
        """``export.destination`` needs its credentials in the pods: named here, not found after training.
        An object store may use workload identity instead, which comes with the pods' service account."""
        from trainer.config.base import parse_destination  # pydantic: kept out of the CLI's import
        from trainer.config.schema import ConfigError
        from trainer.destinations import credential_hint  # the light facts: no export module in the CLI

        try:
            cfg = self.train_config
        except ConfigError:  # the config's own problems are read_config's to report, in its words
            return
        if cfg.export is None:
            return
        dest = parse_destination(cfg.export.destination)
        missing = credential_hint(dest, set(self.secret_env) | set(self.env))
        if missing and (dest.hub or not self.service_account):
            what, flags = missing
            identity = "" if dest.hub else ", or --service-account NAME bound to a cloud role (workload identity)"
            raise CliError(f"export.destination {dest} {what} in the pods", hint=f"pass {flags}{identity}")

    def _refuse_credentials(self) -> None:
        """No flag's value goes into a manifest when it holds a token or a URL with a password, whatever the
        flag and whatever the variable's name: labels and annotations are readable by anyone who can list pods."""
        for f in fields(self):
            if f.name in ("config_text", "secret_env"):  # the config is checked by its schema; refs name Secrets
                continue
            option = _BY_FIELD.get(f.name)
            flag, value = option.flag if option else "--" + f.name.replace("_", "-"), getattr(self, f.name)
            entries = value.items() if isinstance(value, dict) else [(None, v) for v in _as_list(value)]
            for key, item in entries:
                texts = [key, *(item.values() if isinstance(item, dict) else [item])]
                for text in texts:
                    if isinstance(text, str) and (kind := credential_in(text)):
                        plain = key is not None and text is not key and key.isprintable() and shown(key) == repr(key)
                        name = key if plain else "VAR"  # a key is echoed only when it is one plain line
                        raise CliError(
                            f"{f'{flag} {key}' if plain else flag} holds {kind} (not shown), which would be written "
                            "into the manifest in clear",
                            hint=f"store it in a Secret and pass --secret-env {name}=SECRET_NAME/KEY",
                        )

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Each field's default, for the CLI's options (which show them in --help)."""
        return {f.name: f.default for f in fields(cls) if f.default is not MISSING}

    @property
    def train_config(self):
        """The training config, parsed by the trainer's schema (its defaults, not copies of them)."""
        return parse_training_config(self.config_text)

    @property
    def pod_names(self) -> list[str]:
        """The pods' host names, as the job's kind names them (the operator's <job>-master-0, JobSet's ...)."""
        return self.kind.pod_names(self)

    @property
    def nproc_per_node(self) -> int:
        """One process per GPU; a CPU pod runs one process."""
        return max(1, self.gpus_per_node)

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    @property
    def config_map_name(self) -> str:
        return names.config_map(self.name)

    @property
    def claim_name(self) -> str | None:
        return self.pvc or (names.created_claim(self.name) if self.pvc_size else None)

    @property
    def restart_policy(self) -> str:
        """``ExitCode`` (exit 1-127, a bad config or data path, fails the job at once; 128-255 and signals get
        a new pod) for a claim, and for one pod on an emptyDir: OnFailure retried a mistyped data path
        ``backoffLimit`` times, to keep checkpoints that only an in-place restart after an OOM kill or a
        crash would use (eviction and preemption delete the pod and its emptyDir under either policy).
        ``OnFailure`` only for several pods on ``--pod-local-storage``: there a restarted worker must find the
        master's pod, and its checkpoints, still there; a permanent error is then retried (docs/trainer.md)."""
        return "OnFailure" if self.nodes > 1 and not self.claim_name else "ExitCode"

    @property
    def nccl_env(self) -> dict[str, str]:
        return NCCL_PRESETS[self.nccl] if self.nccl else {}


def read_config(path: str | Path, overrides: tuple[str, ...] = ()) -> str:
    """Read ``--config``, apply ``--set KEY=VALUE`` (trainer/config/overrides.py), and validate the result with the
    trainer's schema (pydantic only, no torch): the text the job ships."""
    from trainer.config.load import load_yaml, parse_config, read_config_text
    from trainer.config.overrides import with_overrides
    from trainer.config.schema import ConfigError  # pydantic: see above

    try:
        text = with_overrides(read_config_text(path), overrides, str(path))
        parse_config(load_yaml(text, str(path)), str(path))
    except ConfigError as e:
        raise CliError(str(e), hint="see docs/trainer.md for every key") from None
    return text


def parse_training_config(text: str):
    """A rendered config text (``--config`` or the ConfigMap's ``train.yaml``) as a ``TrainConfig``."""
    from trainer.config.load import load_yaml, parse_config  # pydantic: see above

    return parse_config(load_yaml(text, "train.yaml"), "train.yaml")
