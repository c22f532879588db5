"""KServe's InferenceService (``serving.kserve.io/v1beta1``): a trained model served, beside the job kinds.

A served model is no job (no replicas to resize, no launcher variables), so this is not a
:class:`~operator_cli.kube.kinds.base.JobKind`; it lives here because it is reached the same way: one group,
version and plural, the same create/get/delete/list calls, one template (``inferenceservice.yaml.j2``), and
its runtime's (``servingruntime.yaml.j2``, the ClusterServingRuntime it names).

:class:`ServeSpec` is what ``serve render|apply`` builds from its flags, validated on construction: the export
as ``storageUri`` (no credentials in it: KServe's storage initializer reads them from the service account's
Secrets, and ``--secret-env`` adds Secret *references*), GPUs or CPUs, replicas, KServe's batcher, and the pod
fields a platform sets on every workload (:data:`POD_OPTIONS`: the job options themselves, and the jobs' pod
partials render them). ``--exact``, ``--onnx``, ``--allow-int8-loss`` and ``--precision`` reach the predictor as its
environment variables (``COLBERT_SERVE_EXACT``, ``COLBERT_SERVE_ONNX``, ``COLBERT_SERVE_ALLOW_INT8_LOSS``,
``COLBERT_SERVE_PRECISION``): the ClusterServingRuntime's command is shared by every model it serves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import urlsplit

from operator_cli import constants as C
from operator_cli import rules
from operator_cli.errors import CliError
from operator_cli.options import JOB_OPTIONS
from operator_cli.values import SecretRef, shown
from trainer.config.credentials import credential_in

__all__ = ["ONNX_FORMS", "POD_OPTIONS", "PRECISIONS", "InferenceService", "ServeSpec", "ServingRuntime"]

ONNX_FORMS = ("fp32", "int8")
"""The ONNX encoder's forms the predictor serves (``--onnx``): ``trainer.onnx_export.FORMS``, named here so that
the CLI imports no torch."""
PRECISIONS = ("fp32", "bf16")
"""The PyTorch encoder's precisions (``--precision``): ``trainer.serve.options.PRECISIONS``, named here so that the
CLI imports no pydantic."""

_STORAGE_SCHEMES = ("s3://", "gs://", "az://", "https://", "hf://", "pvc://")
_BUCKET_SCHEMES = ("s3", "gs", "az")
_DEPLOYMENT_MODE = "serving.kserve.io/deploymentMode"  # set by the template: RawDeployment
_JOB = {o.flag: o for o in JOB_OPTIONS}
POD_OPTIONS = tuple(
    _JOB[f] for f in ("--image-pull-secret", "--node-selector", "--toleration", "--label", "--annotation")
)
"""The job options a served model's pod takes too: declared once (:data:`operator_cli.options.JOB_OPTIONS`), the
same help, parsing and rules, rendered by the jobs' pod partials (``_pod.j2``, ``_macros.j2``)."""


@dataclass(frozen=True)
class ServeSpec:
    """One InferenceService: every field checked here, whoever builds it (the CLI, the tests)."""

    name: str
    namespace: str
    storage_uri: str
    image: str = C.DEFAULT_IMAGE
    gpus: int = 0
    gpu_resource: str = C.GPU_RESOURCE
    cpu: str = "2"
    memory: str = "8Gi"
    exact: bool = False
    onnx: str | None = None
    """Encode with the export's ONNX encoder in this form (ONNX Runtime, on the CPU); None: the PyTorch model.
    With ``gpus``, the search runs on the GPU and the encode on the CPU."""
    allow_int8_loss: bool = False
    """Serve ``onnx="int8"`` though its parity says it loses more nDCG@10 than allowed."""
    precision: str = "fp32"
    """The PyTorch encoder's: ``bf16`` runs it under bfloat16 autocast (about half the time on a GPU or a CPU with
    AVX512-BF16 or AMX-BF16); not with ``onnx``."""
    min_replicas: int = 1
    max_replicas: int = 1
    max_batch_size: int | None = None
    max_latency_ms: int = 50
    service_account: str | None = None
    secret_env: dict[str, SecretRef] = field(default_factory=dict)
    runtime: str = C.SERVE_RUNTIME
    image_pull_secrets: list[str] = field(default_factory=list)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, str]] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    """On the InferenceService and its pods, beside this tool's own."""
    annotations: dict[str, str] = field(default_factory=dict)
    ephemeral_storage: str = "10Gi"
    """The node disk a replica asks for: the export KServe's storage initializer downloads into ``/mnt/models``,
    ``/tmp`` (the root filesystem is read-only) and the logs. A request only: a limit would evict the pod whose
    export outgrew it."""
    termination_grace: int = 30
    """Seconds from SIGTERM to SIGKILL: KServe's server finishes the requests in flight in 30."""

    def __post_init__(self) -> None:
        if not rules.full("dns1035", self.name) or len(self.name) > 45:
            raise CliError(
                f"--name must be a DNS-1035 label of at most 45 characters (KServe adds suffixes), "
                f"got {shown(self.name)}"
            )
        if not self.storage_uri.startswith(_STORAGE_SCHEMES):
            raise CliError(
                f"the export must be a URI KServe can fetch ({', '.join(_STORAGE_SCHEMES)}), "
                f"got {shown(self.storage_uri)}"
            )
        if kind := credential_in(self.storage_uri):
            raise CliError(f"the export URI holds {kind}; KServe reads credentials from Secrets (--service-account)")
        self._check_storage_uri()
        for flag, value in (
            ("--cpu", self.cpu),
            ("--memory", self.memory),
            ("--ephemeral-storage", self.ephemeral_storage),
        ):
            if not rules.full("quantity", value):
                raise CliError(f"{flag} must be a Kubernetes quantity like 2 or 8Gi, got {shown(value)}")
        if not 0 <= self.gpus <= C.MAX_GPUS_PER_NODE:
            raise CliError(f"--gpus must be from 0 to {C.MAX_GPUS_PER_NODE}, got {self.gpus}")
        self._check_onnx()
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise CliError(
                f"replicas must be 0 <= --min-replicas <= --max-replicas >= 1, got "
                f"{self.min_replicas} and {self.max_replicas}"
            )
        if self.max_batch_size is not None and not 1 <= self.max_batch_size <= 64:
            raise CliError(
                f"--max-batch-size must be from 1 to 64 (the predictor's queries a request), got {self.max_batch_size}"
            )
        for name in filter(None, (self.service_account, self.runtime)):
            if not rules.full("dns1123", name):
                raise CliError(f"{shown(name)} is not a valid Kubernetes name (DNS-1123)")
        for option in POD_OPTIONS:  # the job options' own rules
            option.check(getattr(self, option.spec_field))
        self._check_metadata()

    def _check_onnx(self) -> None:
        if self.onnx is not None and self.onnx not in ONNX_FORMS:
            raise CliError(f"--onnx must be one of {', '.join(ONNX_FORMS)}, got {shown(self.onnx)}")
        if self.allow_int8_loss and self.onnx != "int8":
            raise CliError(
                f"--allow-int8-loss goes with --onnx int8, got --onnx {self.onnx or '(none)'}",
                hint="add --onnx int8, or drop --allow-int8-loss",
            )
        if self.precision not in PRECISIONS:
            raise CliError(f"--precision must be one of {', '.join(PRECISIONS)}, got {shown(self.precision)}")
        if self.precision != "fp32" and self.onnx:
            raise CliError(
                f"--precision {self.precision} is the PyTorch encoder's; --onnx {self.onnx} has its own",
                hint="drop --precision or --onnx",
            )

    def _check_storage_uri(self) -> None:
        """A bucket (s3://, gs://, az://: the export destination's rules), or a host, a claim, a repository."""
        parts = urlsplit(self.storage_uri)
        if parts.scheme in _BUCKET_SCHEMES:
            from trainer.config.base import parse_destination  # pydantic: kept out of the CLI's import

            try:
                parse_destination(self.storage_uri)
            except ValueError as e:
                raise CliError(
                    f"the export {shown(self.storage_uri)}: {e}; give {parts.scheme}://BUCKET/PREFIX/"
                ) from None
        elif not parts.netloc:
            raise CliError(f"the export {shown(self.storage_uri)} names no {parts.scheme}:// host, claim or repository")

    def _check_metadata(self) -> None:
        """This tool's labels stay its own (list and delete find served models by them); no value holds a
        credential (labels and annotations are readable by anyone who can list pods)."""
        for key in self.labels.keys() & C.OWN_LABELS:
            raise CliError(
                f"--label {key} is set by colbert-k8s itself (serve list and delete find it); use another key"
            )
        if _DEPLOYMENT_MODE in self.annotations:
            raise CliError(f"--annotation {_DEPLOYMENT_MODE} is set by colbert-k8s (RawDeployment); remove it")
        for flag, values in (
            ("--label", self.labels),
            ("--annotation", self.annotations),
            ("--node-selector", self.node_selector),
        ):
            for key, value in values.items():
                if kind := credential_in(value):
                    raise CliError(
                        f"{flag} {key} holds {kind} (not shown), which would be written into the manifest in clear"
                    )


class _CustomResource:
    """The CustomObjectsApi calls of one resource (namespaced unless ``namespaced`` is False)."""

    group: ClassVar[str]
    version: ClassVar[str]
    plural: ClassVar[str]
    kind: ClassVar[str]
    template: ClassVar[str]
    namespaced: ClassVar[bool] = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def create(self, custom: Any, namespace: str, obj: dict[str, Any]) -> Any:
        if not self.namespaced:
            return custom.create_cluster_custom_object(self.group, self.version, self.plural, obj)
        return custom.create_namespaced_custom_object(self.group, self.version, namespace, self.plural, obj)

    def get(self, custom: Any, namespace: str, name: str) -> Any:
        if not self.namespaced:
            return custom.get_cluster_custom_object(self.group, self.version, self.plural, name)
        return custom.get_namespaced_custom_object(self.group, self.version, namespace, self.plural, name)

    def delete(self, custom: Any, namespace: str, name: str) -> Any:
        return custom.delete_namespaced_custom_object(self.group, self.version, namespace, self.plural, name)

    def list(self, custom: Any, namespace: str | None, selector: str) -> Any:
        if namespace is None:
            return custom.list_cluster_custom_object(self.group, self.version, self.plural, label_selector=selector)
        return custom.list_namespaced_custom_object(
            self.group, self.version, namespace, self.plural, label_selector=selector
        )

    def render(self, spec: ServeSpec) -> dict[str, Any]:
        from operator_cli.render import render_one

        return render_one(self.template, spec)


class InferenceService(_CustomResource):
    group, version, plural, kind = C.SERVE_GROUP, C.SERVE_VERSION, C.SERVE_PLURAL, C.SERVE_KIND
    template = "inferenceservice.yaml.j2"

    @staticmethod
    def url(isvc: dict[str, Any]) -> str:
        return (isvc.get("status") or {}).get("url") or ""

    @staticmethod
    def ready(isvc: dict[str, Any]) -> str:
        conditions = (isvc.get("status") or {}).get("conditions") or []
        found = [c for c in conditions if isinstance(c, dict) and c.get("type") == "Ready"]
        return found[0].get("status", "Unknown") if found else "Unknown"


class ServingRuntime(_CustomResource):
    group, version, plural, kind = C.SERVE_GROUP, C.SERVE_RUNTIME_VERSION, C.SERVE_RUNTIME_PLURAL, C.SERVE_RUNTIME_KIND
    template = "servingruntime.yaml.j2"
    namespaced = False
