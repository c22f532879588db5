"""Served models on the cluster: create an InferenceService (and the ClusterServingRuntime it names, once),
list this tool's, delete one of this tool's. Every request goes through :meth:`Cluster.request`, so errors are
the same one line (kind, namespace/name, status) as the jobs'."""

from __future__ import annotations

from typing import Any

from operator_cli import constants as C
from operator_cli.errors import CliError
from operator_cli.kube.cluster import Cluster
from operator_cli.kube.kinds.inferenceservice import InferenceService, ServingRuntime

__all__ = ["apply", "delete", "list_served"]

ISVC, RUNTIME = InferenceService(), ServingRuntime()
_SELECTOR = f"{C.LABEL_MANAGED_BY}={C.MANAGED_BY},{C.LABEL_COMPONENT}=serve"


def _ours(obj: dict[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get(C.LABEL_MANAGED_BY) == C.MANAGED_BY and labels.get(C.LABEL_COMPONENT) == "serve"


def apply(cluster: Cluster, runtime: dict[str, Any], isvc: dict[str, Any]) -> list[str]:
    """Create the runtime when the cluster has none of that name, then the InferenceService; what was created."""
    made = []
    name = runtime["metadata"]["name"]
    get = lambda: RUNTIME.get(cluster.custom, cluster.ns, name)
    if cluster.read(get, "get", RUNTIME.kind, name, namespace=None) is None:
        create = lambda: RUNTIME.create(cluster.custom, cluster.ns, runtime)
        try:
            cluster.request(create, "create", RUNTIME.kind, name, namespace=None)
            made.append(f"{RUNTIME.kind} {name}")
        except CliError as e:
            if e.status != 409:  # 409: another apply made it meanwhile, which is all this needs
                raise
    isvc_name = isvc["metadata"]["name"]
    try:
        cluster.request(lambda: ISVC.create(cluster.custom, cluster.ns, isvc), "create", ISVC.kind, isvc_name)
    except CliError as e:
        if e.status == 409:
            raise CliError(
                f"{ISVC.kind} {cluster.ns}/{isvc_name} already exists",
                hint=f"colbert-k8s serve delete {isvc_name}, or serve it under another --name",
            ) from None
        raise
    return [*made, f"{ISVC.kind} {isvc_name}"]


def list_served(cluster: Cluster, all_namespaces: bool = False) -> list[dict[str, Any]]:
    """This tool's InferenceServices (the selector applied again: an API that ignores it lists no one else's)."""
    ns = None if all_namespaces else cluster.ns
    found = cluster.items(lambda: ISVC.list(cluster.custom, ns, _SELECTOR), ISVC.kind, namespace=ns)
    return [i for i in found if _ours(i)]


def delete(cluster: Cluster, name: str) -> str:
    """Delete one of this tool's InferenceServices; another's of that name is left alone, in one line."""
    found = cluster.read(lambda: ISVC.get(cluster.custom, cluster.ns, name), "get", ISVC.kind, name)
    if found is None:
        raise CliError(f"{ISVC.kind} {cluster.ns}/{name} not found", hint="see `colbert-k8s serve list`", exit_code=1)
    if not _ours(found):
        raise CliError(f"{ISVC.kind} {cluster.ns}/{name} was not created by colbert-k8s serve; left alone", exit_code=1)
    cluster.request(lambda: ISVC.delete(cluster.custom, cluster.ns, name), "delete", ISVC.kind, name)
    return f"{ISVC.kind} {name}"
