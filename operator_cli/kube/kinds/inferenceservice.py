"""KServe's InferenceService (``serving.kserve.io/v1beta1``): a trained model served, beside the job kinds.

A served model is no job (no replicas to resize, no launcher variables), so this is not a
:class:`~operator_cli.kube.kinds.base.JobKind`; it lives here because it is reached the same way: one group,
version and plural, the same create/get/delete/list calls, one template (``inferenceservice.yaml.j2``), and
its runtime's (``servingruntime.yaml.j2``, the ClusterServingRuntime it names).

:class:`ServeSpec` is what ``serve render|apply`` builds from its flags, validated on construction: the export
as ``storageUri`` (no credentials in it: KServe's storage initializer reads them from the service account's
Secrets, and ``--secret-env`` adds Secret *references*), GPUs or CPUs, replicas, KServe's batcher.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from operator_cli import constants as C
from operator_cli import rules
from operator_cli.errors import CliError
from operator_cli.values import SecretRef, shown
from trainer.config.credentials import credential_in

__all__ = ["InferenceService", "ServeSpec", "ServingRuntime"]

_STORAGE_SCHEMES = ("s3://", "gs://", "az://", "https://", "hf://", "pvc://")


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
    min_replicas: int = 1
    max_replicas: int = 1
    max_batch_size: int | None = None
    max_latency_ms: int = 50
    service_account: str | None = None
    secret_env: dict[str, SecretRef] = field(default_factory=dict)
    runtime: str = C.SERVE_RUNTIME

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
        for flag, value in (("--cpu", self.cpu), ("--memory", self.memory)):
            if not rules.full("quantity", value):
                raise CliError(f"{flag} must be a Kubernetes quantity like 2 or 8Gi, got {shown(value)}")
        if not 0 <= self.gpus <= C.MAX_GPUS_PER_NODE:
            raise CliError(f"--gpus must be from 0 to {C.MAX_GPUS_PER_NODE}, got {self.gpus}")
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
