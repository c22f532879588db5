"""The typed job spec: every option of ``submit``/``render``/``local``, validated on construction.

Options are parsed here once (``K=V`` pairs, tolerations, secret references) so that the templates
only ever see clean, typed values. Each check raises :class:`CliError` with a message of the form
"``--flag`` must ..., got ``value``". Secret *values* never pass through here: ``--secret-env``
takes a Secret name and key, and ``--env`` refuses names that look like credentials.
"""

from __future__ import annotations

import re
import secrets
import string
from dataclasses import dataclass, field
from pathlib import Path

from operator_cli.constants import DEFAULT_IMAGE, TERMINATION_GRACE_SECONDS
from operator_cli.errors import CliError

__all__ = ["JobSpec", "SecretRef", "parse_pairs", "parse_toleration", "parse_secret_env", "generate_name"]

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUALIFIED_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/:@]*$")
CREDENTIAL_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|CREDENTIAL|PRIVATE_?KEY)", re.I)
# set by the Training Operator or by us; a user value would silently break the rendezvous
RESERVED_ENV = {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "PYTHONUNBUFFERED"}
EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}
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


def parse_pairs(values: tuple[str, ...] | list[str], flag: str) -> dict[str, str]:
    """``("a=1", "b=2")`` -> ``{"a": "1", "b": "2"}``; a missing ``=`` is one clear error."""
    out: dict[str, str] = {}
    for raw in values:
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise CliError(f"{flag} must be KEY=VALUE, got {raw!r}")
        out[key] = value
    return out


def parse_toleration(raw: str) -> dict[str, str]:
    """``key[=value]:Effect`` -> a toleration (``Exists`` when no value is given)."""
    body, sep, effect = raw.rpartition(":")
    if not sep or effect not in EFFECTS or not body:
        raise CliError(f"--toleration must be KEY[=VALUE]:EFFECT with EFFECT in {sorted(EFFECTS)}, got {raw!r}")
    key, eq, value = body.partition("=")
    if not QUALIFIED_NAME.match(key):
        raise CliError(f"--toleration key must be a label key, got {key!r}")
    tol = {"key": key, "operator": "Equal" if eq else "Exists", "effect": effect}
    if eq:
        tol["value"] = value
    return tol


def parse_secret_env(raw: str) -> tuple[str, SecretRef]:
    """``VAR=secret/key`` -> ``("VAR", SecretRef("secret", "key"))``."""
    var, sep, ref = raw.partition("=")
    secret, slash, key = ref.partition("/")
    if not sep or not slash or not var or not secret or not key:
        raise CliError(f"--secret-env must be VAR=SECRET_NAME/KEY, got {raw.split('=')[0]!r}=...")
    if not ENV_NAME.match(var):
        raise CliError(f"--secret-env variable must be a valid environment variable name, got {var!r}")
    if not DNS1123_SUBDOMAIN.match(secret) or len(secret) > 253:
        raise CliError(f"--secret-env secret name must be a DNS-1123 name, got {secret!r}")
    if not SECRET_KEY.match(key):
        raise CliError(f"--secret-env key must match [-._a-zA-Z0-9]+, got {key!r}")
    return var, SecretRef(secret, key)


def generate_name(prefix: str = "colbert") -> str:
    alphabet = string.ascii_lowercase + string.digits
    return f"{prefix}-{''.join(secrets.choice(alphabet) for _ in range(5))}"


@dataclass(frozen=True)
class JobSpec:
    """A validated training job. Field docs double as ``--help`` text."""

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
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not DNS1035.match(self.name):
            raise CliError(
                f"--name must be a DNS-1035 label (lowercase letters, digits, '-', starting with a letter), "
                f"got {self.name!r}"
            )
        longest = f"{self.name}-worker-{max(0, self.nodes - 2)}" if self.nodes > 1 else f"{self.name}-master-0"
        if len(longest) > 63:
            raise CliError(f"--name {self.name!r} is too long: pod name {longest!r} would exceed 63 characters")
        if not DNS1035.match(self.namespace) and not DNS1123_SUBDOMAIN.match(self.namespace):
            raise CliError(f"--namespace must be a DNS-1123 label, got {self.namespace!r}")
        if not 1 <= self.nodes <= 1024:
            raise CliError(f"--nodes must be between 1 and 1024, got {self.nodes}")
        if not 0 <= self.gpus_per_node <= 16:
            raise CliError(f"--gpus-per-node must be between 0 and 16, got {self.gpus_per_node}")
        if not IMAGE.match(self.image):
            raise CliError(f"--image must be an image reference like REGISTRY/NAME:TAG, got {self.image!r}")
        for flag, value in (
            ("--cpu", self.cpu),
            ("--memory", self.memory),
            ("--shm-size", self.shm_size),
            ("--pvc-size", self.pvc_size),
        ):
            if value is not None and not QUANTITY.match(value):
                raise CliError(f"{flag} must be a Kubernetes quantity like 4, 500m or 32Gi, got {value!r}")
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
        if not 0 <= self.termination_grace <= 24 * 3600:
            raise CliError(f"--termination-grace-period must be 0..86400 seconds, got {self.termination_grace}")
        for flag, value in (
            ("--pvc", self.pvc),
            ("--priority-class", self.priority_class),
            ("--service-account", self.service_account),
            ("--storage-class", self.storage_class),
        ):
            if value is not None and not DNS1123_SUBDOMAIN.match(value):
                raise CliError(f"{flag} must be a DNS-1123 name, got {value!r}")
        for secret in self.image_pull_secrets:
            if not DNS1123_SUBDOMAIN.match(secret):
                raise CliError(f"--image-pull-secret must be a DNS-1123 name, got {secret!r}")
        if self.queue is not None and not LABEL_VALUE.match(self.queue):
            raise CliError(f"--queue must be a valid label value, got {self.queue!r}")
        self._check_labels(self.node_selector, "--node-selector")
        self._check_labels(self.labels, "--label")
        for key in self.annotations:
            if not QUALIFIED_NAME.match(key):
                raise CliError(f"--annotation key must be a qualified name like example.com/key, got {key!r}")
        for var in self.env:
            if not ENV_NAME.match(var):
                raise CliError(f"--env name must be a valid environment variable name, got {var!r}")
            if var in RESERVED_ENV or var.startswith("PET_"):
                raise CliError(f"--env {var} is set by the Training Operator; remove it")
            if CREDENTIAL_NAME.search(var):
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
            raise CliError(f"--nccl must be one of {sorted(NCCL_PRESETS)}, got {self.nccl!r}")
        if self.nccl and self.gpus_per_node == 0:
            raise CliError("--nccl applies to GPU jobs only; drop it or set --gpus-per-node")

    @staticmethod
    def _check_labels(labels: dict[str, str], flag: str) -> None:
        for key, value in labels.items():
            if not QUALIFIED_NAME.match(key) or len(key.split("/")[-1]) > 63:
                raise CliError(f"{flag} key must be a label key like example.com/name, got {key!r}")
            if len(value) > 63 or not LABEL_VALUE.match(value):
                raise CliError(f"{flag} value for {key} must be a label value (<= 63 of [A-Za-z0-9-_.]), got {value!r}")

    @property
    def train_config(self):
        """The training config, parsed by the trainer's schema (its defaults, not copies of them)."""
        return parse_training_config(self.config_text)

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
    def nccl_env(self) -> dict[str, str]:
        return NCCL_PRESETS[self.nccl] if self.nccl else {}


def read_config(path: str | Path) -> str:
    """Read ``--config`` and validate it with the trainer's schema (pydantic only, no torch)."""
    from trainer.config import ConfigError, load_config

    try:
        load_config(path)
    except ConfigError as e:
        raise CliError(str(e), hint="see README 'Training config' for every key") from e
    return Path(path).read_text(encoding="utf-8")


def parse_training_config(text: str):
    """A rendered config text (``--config`` or the ConfigMap's ``train.yaml``) as a ``TrainConfig``."""
    import yaml

    from trainer.config import parse_config

    return parse_config(yaml.safe_load(text), "train.yaml")
