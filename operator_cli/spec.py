"""The typed job spec: every option of ``submit``/``render``/``local``, validated on construction.

Options are parsed here once (``K=V`` pairs, tolerations, secret references) so that the templates
only ever see clean, typed values. Each check raises :class:`CliError` with a message of the form
"``--flag`` must ..., got ``value``". Secret *values* never pass through here: ``--secret-env``
takes a Secret name and key, and ``--env`` refuses names that look like credentials.
"""

from __future__ import annotations

import secrets
import string
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from operator_cli import rules, scheduling
from operator_cli.constants import (
    APIS,
    DEFAULT_IMAGE,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    MAX_GPUS_PER_NODE,
    MAX_NODES,
    TERMINATION_GRACE_SECONDS,
    V2_DEFAULT_RUNTIME,
)
from operator_cli.errors import CliError
from trainer.credentials import credential_in

__all__ = [
    "JobSpec",
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

EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}
INT32_MAX = 2**31 - 1  # backoffLimit, ttlSecondsAfterFinished are int32 in the API
INT64_MAX = 2**63 - 1  # activeDeadlineSeconds is int64
OWN_LABELS = {LABEL_NAME, LABEL_INSTANCE, LABEL_MANAGED_BY, LABEL_COMPONENT}  # set on every object
# JobSpec fields whose flag is not --FIELD-NAME
_FLAGS = {"labels": "--label", "annotations": "--annotation", "tolerations": "--toleration",
          "image_pull_secrets": "--image-pull-secret", "termination_grace": "--termination-grace-period"}  # fmt: skip

NCCL_PRESETS: dict[str, dict[str, str]] = {
    # TCP sockets over the pod network: works on every cluster.
    "socket": {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "WARN"},
    # InfiniBand/RoCE for data, the pod network only for bootstrap.
    "ib": {"NCCL_IB_DISABLE": "0", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_NET_GDR_LEVEL": "PHB", "NCCL_DEBUG": "WARN"},
}


@dataclass(frozen=True)
class SecretRef:
    secret: str
    key: str


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def shown(value: str, limit: int = 80) -> str:
    """A user value fit to echo in an error: never one that could be a secret, never unbounded."""
    if not rules.full("printable", value) or len(value) > limit or "@" in value:  # user:password@host
        return f"a {len(value)}-character value (not shown)"
    return repr(value)


def parse_pairs(values: tuple[str, ...] | list[str], flag: str) -> dict[str, str]:
    """``("a=1", "b=2")`` -> ``{"a": "1", "b": "2"}``; a missing ``=`` or a repeated key is one clear error.

    Values are never echoed (``--env "=$TOKEN"`` must not print the token)."""
    out: dict[str, str] = {}
    for raw in values:
        key, sep, value = raw.partition("=")
        if not sep:
            raise CliError(f"{flag} must be KEY=VALUE, got a value without KEY= (not shown)")
        if not key:
            raise CliError(f"{flag} must be KEY=VALUE, got an empty KEY")
        if key in out:
            raise CliError(f"{flag} {shown(key)} is given twice; keep one")
        if rules.has_control_chars(value):
            raise CliError(f"{flag} {shown(key)}: the value holds control characters; remove them")
        out[key] = value
    return out


def parse_toleration(raw: str) -> dict[str, str]:
    """``key[=value]:Effect`` -> a toleration (``Exists`` when no value is given)."""
    body, sep, effect = raw.rpartition(":")
    if not sep or effect not in EFFECTS or not body:
        raise CliError(f"--toleration must be KEY[=VALUE]:EFFECT with EFFECT in {sorted(EFFECTS)}, got {shown(raw)}")
    key, eq, value = body.partition("=")
    if not rules.full("qualified_name", key):
        raise CliError(f"--toleration key must be a label key, got {shown(key)}")
    if eq and not rules.full("label_value", value):
        raise CliError(f"--toleration value for {key} must be a label value, got {shown(value)}")
    tol = {"key": key, "operator": "Equal" if eq else "Exists", "effect": effect}
    if eq:
        tol["value"] = value
    return tol


def parse_secret_env(raw: str) -> tuple[str, SecretRef]:
    """``VAR=secret/key`` -> ``("VAR", SecretRef("secret", "key"))``."""
    var, sep, ref = raw.partition("=")
    secret, slash, key = ref.partition("/")
    if not sep or not slash or not var or not secret or not key:
        # the argument may be a pasted secret value: name it only when it starts like a variable name
        what = (
            f"{var!r}=..." if sep and rules.full("env_name", var) else "a value that is not VAR=SECRET/KEY (not shown)"
        )
        raise CliError(f"--secret-env must be VAR=SECRET_NAME/KEY, got {what}")
    if not rules.full("env_name", var):
        raise CliError(f"--secret-env variable must be a valid environment variable name, got {shown(var)}")
    if rules.reserved_env(var):
        raise CliError(f"--secret-env {var} is set by the Training Operator or this tool; remove it")
    # what follows '=' may be a pasted secret value (it often contains '/'): describe it, never echo it
    if not rules.full("dns1123", secret):
        raise CliError(
            f"--secret-env {var}: the part before '/' must name a Secret (a DNS-1123 name: lowercase letters, "
            "digits, '-', '.'); it is not shown, in case a secret value was pasted there"
        )
    if not rules.full("secret_key", key):
        raise CliError(
            f"--secret-env {var}: the part after '/' must be a key of the Secret ([-._a-zA-Z0-9]+); "
            "it is not shown, in case a secret value was pasted there"
        )
    return var, SecretRef(secret, key)


def parse_secret_envs(values: tuple[str, ...] | list[str]) -> dict[str, SecretRef]:
    """Every ``--secret-env``; a variable given twice is refused (the pod would get only one of them)."""
    out: dict[str, SecretRef] = {}
    for raw in values:
        var, ref = parse_secret_env(raw)
        if var in out:
            raise CliError(f"--secret-env {var} is given twice; keep one")
        out[var] = ref
    return out


def check_shape(nodes: int, gpus_per_node: int | None) -> None:
    """``--nodes`` and ``--gpus-per-node`` within this tool's bounds (``gpus_per_node`` None: unchanged)."""
    if not 1 <= nodes <= MAX_NODES:
        raise CliError(f"--nodes must be between 1 and {MAX_NODES}, got {nodes}")
    if gpus_per_node is not None and not 0 <= gpus_per_node <= MAX_GPUS_PER_NODE:
        raise CliError(f"--gpus-per-node must be between 0 and {MAX_GPUS_PER_NODE}, got {gpus_per_node}")


def parse_elastic(raw: str) -> tuple[int, int]:
    """``--elastic MIN:MAX`` -> ``(MIN, MAX)``: the node counts the job may shrink to and grow to."""
    low, sep, high = raw.partition(":")
    if not (sep and low.isdigit() and high.isdigit()):
        raise CliError(f"--elastic must be MIN:MAX node counts like 1:4, got {shown(raw)}")
    low_n, high_n = int(low), int(high)
    if not 1 <= low_n <= high_n <= MAX_NODES:
        raise CliError(f"--elastic {low_n}:{high_n} must have 1 <= MIN <= MAX <= {MAX_NODES}")
    return low_n, high_n


def generate_name(prefix: str = "colbert") -> str:
    alphabet = string.ascii_lowercase + string.digits
    return f"{prefix}-{''.join(secrets.choice(alphabet) for _ in range(5))}"


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
    api: str = "pytorchjob"
    """pytorchjob: Training Operator v1 PyTorchJob; trainjob: Kubeflow Trainer v2 TrainJob."""
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
        if not rules.full("dns1035", self.name):
            raise CliError(
                f"--name must be a DNS-1035 label (lowercase letters, digits, '-', starting with a letter), "
                f"got {shown(self.name)}"
            )
        longest = self.pod_names[-1]
        if len(longest) > 63:
            raise CliError(f"--name {shown(self.name)} is too long: pod name {longest!r} would exceed 63 characters")
        if not rules.full("dns1123_label", self.namespace):
            raise CliError(
                f"--namespace must be a DNS-1123 label (at most 63 of a-z, 0-9, '-'), got {shown(self.namespace)}"
            )
        check_shape(self.nodes, self.gpus_per_node)
        if not rules.full("image", self.image):
            raise CliError(f"--image must be an image reference like REGISTRY/NAME:TAG, got {shown(self.image)}")
        for flag, value in (
            ("--cpu", self.cpu),
            ("--memory", self.memory),
            ("--shm-size", self.shm_size),
            ("--pvc-size", self.pvc_size),
        ):
            if value is not None and not rules.full("quantity", value):
                raise CliError(f"{flag} must be a Kubernetes quantity like 4, 500m or 32Gi, got {shown(value)}")
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
        for flag, value, top in (
            ("--backoff-limit", self.backoff_limit, INT32_MAX),
            ("--active-deadline", self.active_deadline, INT64_MAX),
            ("--ttl-after-finished", self.ttl_after_finished, INT32_MAX),
        ):
            if value is not None and not 0 <= value <= top:
                raise CliError(f"{flag} must be between 0 and {top} (the API field's range), got {value}")
        preset = NCCL_PRESETS.get(self.nccl or "", {})
        for var in self.env:
            if var in self.secret_env:
                raise CliError(f"{var} is given by both --env and --secret-env; keep one")
            if var in preset:
                raise CliError(f"--env {var} is also set by --nccl {self.nccl}; drop one of them")
        if not 0 <= self.termination_grace <= 24 * 3600:
            raise CliError(f"--termination-grace-period must be 0..86400 seconds, got {self.termination_grace}")
        for flag, value in (
            ("--pvc", self.pvc),
            ("--priority-class", self.priority_class),
            ("--service-account", self.service_account),
            ("--storage-class", self.storage_class),
        ):
            if value is not None and not rules.full("dns1123", value):
                raise CliError(f"{flag} must be a DNS-1123 name, got {shown(value)}")
        for secret in self.image_pull_secrets:
            if not rules.full("dns1123", secret):
                raise CliError(f"--image-pull-secret must be a DNS-1123 name, got {shown(secret)}")
        if self.queue is not None and not rules.full("label_value", self.queue):
            raise CliError(f"--queue must be a valid label value, got {shown(self.queue)}")
        self._check_labels(self.node_selector, "--node-selector")
        self._check_labels(self.labels, "--label")
        for key in self.labels.keys() & OWN_LABELS:
            raise CliError(
                f"--label {key} is set by colbert-k8s itself (status, logs, list and delete find their jobs by it); "
                "use another key"
            )
        for key in self.annotations:
            if not rules.full("qualified_name", key):
                raise CliError(f"--annotation key must be a qualified name like example.com/key, got {shown(key)}")
            if rules.has_control_chars(self.annotations[key]):
                raise CliError(f"--annotation {key}: the value holds control characters; remove them")
        for var in self.env:
            if not rules.full("env_name", var):
                raise CliError(f"--env name must be a valid environment variable name, got {shown(var)}")
            if rules.reserved_env(var):
                raise CliError(f"--env {var} is set by the Training Operator or this tool; remove it")
            if rules.credential_like(var):
                raise CliError(
                    f"--env {var}=... looks like a credential and would be written into the manifest in clear",
                    hint=f"store it in a Secret and pass --secret-env {var}=SECRET_NAME/KEY",
                )
        overlap = set(self.env) & set(self.secret_env)
        if overlap:
            raise CliError(f"{sorted(overlap)[0]} is given both as --env and --secret-env; keep one")
        if self.backoff_limit < 0:
            raise CliError(f"--backoff-limit must be >= 0, got {self.backoff_limit}")
        for flag, value in (
            ("--active-deadline", self.active_deadline),
            ("--ttl-after-finished", self.ttl_after_finished),
        ):
            if value is not None and value < 0:
                raise CliError(f"{flag} must be >= 0 seconds, got {value}")
        if self.nccl is not None and self.nccl not in NCCL_PRESETS:
            raise CliError(f"--nccl must be one of {sorted(NCCL_PRESETS)}, got {shown(self.nccl)}")
        if self.nccl and self.gpus_per_node == 0:
            raise CliError("--nccl applies to GPU jobs only; drop it or set --gpus-per-node")
        self._check_api()
        self._check_elastic()
        self._check_export()
        scheduling.check(self)

    @property
    def gpu_resource(self) -> str:
        """The extended resource each GPU process asks for: a whole GPU, or one MIG slice of ``--mig``."""
        return scheduling.gpu_resource(self.mig)

    @property
    def topology_annotations(self) -> dict[str, str]:
        """Kueue's pod-set topology request, on every pod template."""
        return scheduling.topology_annotations(self.topology_required, self.topology_preferred)

    @property
    def pod_annotations(self) -> dict[str, str]:
        """Annotations of the pod templates (``--annotation`` is added to them by the templates)."""
        return {"sidecar.istio.io/inject": "false", **self.topology_annotations}

    def _check_api(self) -> None:
        if self.api not in APIS:
            raise CliError(f"--api must be one of {', '.join(APIS)}, got {shown(self.api)}")
        if not rules.full("dns1123", self.runtime):
            raise CliError(f"--runtime must be a ClusterTrainingRuntime name (DNS-1123), got {shown(self.runtime)}")
        if self.api == "trainjob" and self.priority_class:
            raise CliError(
                "--priority-class cannot be set on a TrainJob (Trainer v2.3.0 lets a TrainJob patch no "
                "priorityClassName)",
                hint="use a ClusterTrainingRuntime whose pod template sets it (--runtime NAME), "
                "or Kueue's --label kueue.x-k8s.io/priority-class=NAME",
            )

    def _check_elastic(self) -> None:
        """An elastic job must resume on any node count in MIN..MAX: shared checkpoints, one mathematics."""
        if self.elastic is None:
            return
        low, high = self.elastic
        flag = f"--elastic {low}:{high}"
        if self.api == "trainjob":
            raise CliError(
                f"{flag}: a TrainJob (Kubeflow Trainer v2.3.0) has no elastic policy (KEP-2903 is a proposal)",
                hint="use --api pytorchjob: its elasticPolicy runs torchrun's elastic agents",
            )
        if not low <= self.nodes <= high:
            raise CliError(f"{flag}: --nodes {self.nodes} (the pods asked for at start) must be within {low}..{high}")
        if not self.claim_name:
            raise CliError(
                f"{flag} needs shared storage: a group re-formed without a node must find that node's checkpoints",
                hint="add --pvc-size 50Gi (a new ReadWriteMany claim) or --pvc NAME",
            )
        from trainer.config import ConfigError
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
        from trainer.config_base import parse_destination
        from trainer.export import credential_hint

        cfg = self.train_config
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
            flag, value = _FLAGS.get(f.name, "--" + f.name.replace("_", "-")), getattr(self, f.name)
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

    @staticmethod
    def _check_labels(labels: dict[str, str], flag: str) -> None:
        for key, value in labels.items():
            if not rules.full("qualified_name", key):
                raise CliError(f"{flag} key must be a label key like example.com/name, got {shown(key)}")
            if not rules.full("label_value", value):
                raise CliError(
                    f"{flag} value for {key} must be a label value (<= 63 of [A-Za-z0-9-_.]), got {shown(value)}"
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
        """The pods' host names: the operator's <job>-master-0/-worker-i, or JobSet's <job>-node-0-i."""
        if self.api == "trainjob":
            return [f"{self.name}-node-0-{i}" for i in range(self.nodes)]
        if self.elastic:  # Workers only: the operator's rendezvous endpoint is <job>-worker-0
            return [f"{self.name}-worker-{i}" for i in range(max(self.nodes, self.elastic[1]))]
        return [f"{self.name}-master-0"] + [f"{self.name}-worker-{i}" for i in range(self.nodes - 1)]

    @property
    def nproc_per_node(self) -> int:
        """One process per GPU; a CPU pod runs one process."""
        return max(1, self.gpus_per_node)

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    @property
    def config_map_name(self) -> str:
        return f"{self.name}-config"

    @property
    def claim_name(self) -> str | None:
        return self.pvc or (f"{self.name}-workspace" if self.pvc_size else None)

    @property
    def restart_policy(self) -> str:
        """``ExitCode`` when /workspace is a claim: a bad config (exit 1-127) fails the job at once, a lost
        peer or preemption (128-255) gets a new pod that resumes from the claim's checkpoint. With an
        emptyDir a new pod would start from step 0, so ``OnFailure`` restarts the container in place."""
        return "ExitCode" if self.claim_name else "OnFailure"

    @property
    def nccl_env(self) -> dict[str, str]:
        return NCCL_PRESETS[self.nccl] if self.nccl else {}


def read_config(path: str | Path) -> str:
    """Read ``--config`` and validate it with the trainer's schema (pydantic only, no torch)."""
    from trainer.config import ConfigError
    from trainer.config_yaml import load_yaml, parse_config, read_config_text

    try:
        text = read_config_text(path)
        parse_config(load_yaml(text, str(path)), str(path))
    except ConfigError as e:
        raise CliError(str(e), hint="see README 'Training config' for every key") from None
    return text


def parse_training_config(text: str):
    """A rendered config text (``--config`` or the ConfigMap's ``train.yaml``) as a ``TrainConfig``."""
    from trainer.config_yaml import load_yaml, parse_config

    return parse_config(load_yaml(text, "train.yaml"), "train.yaml")
