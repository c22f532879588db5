"""``colbert-k8s doctor``: check a cluster before the first submit, one line per check, each with a hint.

What a user would otherwise check one by one with kubectl: the job APIs' CRDs and their controller, a
torch ClusterTrainingRuntime (Trainer v2: this tool's, which fails fast, or the stock one), GPU nodes and
their MIG slices, a storage class that can serve ReadWriteMany, the namespace and its quota, Kueue queues,
Topology and ResourceFlavor objects (absent CRDs read as "not installed"), and whether this user may
create what ``submit`` creates (SelfSubjectAccessReview). Every request goes through :class:`Cluster`
(timeouts, one-line errors); a check the user may not read is a WARN, not a crash. The exit code is the
worst line: 0 OK, 1 WARN, 2 FAIL.
"""

from __future__ import annotations

from dataclasses import dataclass

from operator_cli import constants as C
from operator_cli.errors import CliError
from operator_cli.kube.cluster import Cluster
from operator_cli.kube.kinds import DEFAULT_API, KINDS
from operator_cli.kube.runtime import runtime_health

__all__ = ["Check", "LEVELS", "run_checks"]

LEVELS = {"OK": 0, "WARN": 1, "FAIL": 2}
# provisioners whose volumes many nodes can mount read-write at once (the usual ones; others may too)
RWX_PROVISIONERS = (
    "nfs",
    "cephfs",
    "efs.csi.aws.com",
    "filestore",
    "file.csi.azure.com",
    "azurefile",
    "lustre",
    "gpfs",
    "longhorn",
    "juicefs",
    "weka",
    "netapp",
    "portworx",
)
GPU = C.GPU_RESOURCE


def _name(obj: dict) -> str:
    return str((obj.get("metadata") or {}).get("name", "?"))


@dataclass
class Check:
    name: str
    level: str  # OK, WARN or FAIL
    detail: str
    hint: str = ""


def run_checks(cluster: Cluster, api: str) -> list[Check]:
    """Every check, in the order a first submit would trip on them. ``api``: pytorchjob, trainjob or auto."""
    checks, served = _crds(cluster, api)
    checks += [_controller(cluster, key) for key in served]
    if any(KINDS[key].uses_runtime for key in served):
        checks.append(_runtime(cluster))
    checks += [_gpus(cluster), _mig(cluster), _storage(cluster), _namespace(cluster), _queues(cluster)]
    checks.append(_topologies(cluster))
    return checks + _access(cluster, served or ([api] if api != "auto" else [DEFAULT_API]))


def _guarded(name: str):
    """A check that cannot read what it needs says so as a WARN, with the error's one line."""

    def wrap(fn):
        def inner(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except CliError as e:
                return Check(name, "WARN", f"could not check: {e.message}", e.hint or "")

        return inner

    return wrap


def _crds(cluster: Cluster, api: str) -> tuple[list[Check], list[str]]:
    """A line per job API, and the APIs this job may use (served, and asked for or ``auto``)."""
    from kubernetes import client

    ext = client.ApiextensionsV1Api(cluster.api)
    lines, served = {}, []
    for key, kind in KINDS.items():
        try:
            crd = cluster.read(
                lambda k=kind: ext.read_custom_resource_definition(k.crd),
                "get",
                "CustomResourceDefinition",
                kind.crd,
                None,
            )
        except CliError as e:
            lines[key] = Check(f"{key} API", "WARN", f"could not check: {e.message}", e.hint or "")
            continue
        versions = [v["name"] for v in (crd or {}).get("spec", {}).get("versions", []) if v.get("served")]
        if kind.version in versions:
            lines[key] = Check(f"{key} API", "OK", f"{kind.crd} serves {', '.join(versions)}")
            if api in (key, "auto"):
                served.append(key)
            continue
        found = f"serves {', '.join(versions)}, not {kind.version}" if crd else "is not installed"
        if api == key:
            lines[key] = Check(f"{key} API", "FAIL", f"{kind.crd} {found}", f"install it with: {kind.install}")
        else:
            lines[key] = Check(f"{key} API", "OK", f"{kind.crd} {found} (not used)")
    if api == "auto" and not served:
        for key, line in lines.items():
            detail = line.detail.removesuffix(" (not used)") + "; neither job API is served"
            lines[key] = Check(line.name, "FAIL", detail, f"install Kubeflow Trainer v2: {C.TRAINER_V2_INSTALL}")
    return list(lines.values()), served


def _controller(cluster: Cluster, key: str) -> Check:
    from kubernetes import client

    ns, name = KINDS[key].controller
    check = f"{key} controller"
    apps = client.AppsV1Api(cluster.api)
    try:
        dep = cluster.read(lambda: apps.read_namespaced_deployment(name, ns), "get", "Deployment", name, ns)
    except CliError as e:
        return Check(check, "WARN", f"could not check: {e.message}", e.hint or "")
    if dep is None:
        return Check(
            check,
            "WARN",
            f"no Deployment {ns}/{name}",
            "it may run under another name; check that its pods are Running",
        )
    ready, wanted = (dep.get("status") or {}).get("readyReplicas") or 0, (dep.get("spec") or {}).get("replicas", 1)
    if ready < 1:
        return Check(
            check,
            "FAIL",
            f"Deployment {ns}/{name}: {ready}/{wanted} ready",
            f"kubectl -n {ns} describe deployment {name}",
        )
    return Check(check, "OK", f"Deployment {ns}/{name}: {ready}/{wanted} ready")


@_guarded("torch runtime")
def _runtime(cluster: Cluster) -> Check:
    """This tool's runtime if it is there, else the stock one that submit falls back to (``kube/runtime.py``)."""
    return Check("torch runtime", *runtime_health(cluster))


@_guarded("Kueue topologies")
def _topologies(cluster: Cluster) -> Check:
    """Kueue's Topology objects (the levels --topology-* may name) and ResourceFlavors (which use them)."""

    def listed(plural: str, kind: str) -> list[dict] | None:
        answer = cluster.read(
            lambda: cluster.custom.list_cluster_custom_object(C.KUEUE_GROUP, C.KUEUE_VERSION, plural),
            "list",
            kind,
            namespace=None,
        )
        return None if answer is None else cluster.items_of(answer, kind)

    topologies, flavors = listed("topologies", "Topology"), listed("resourceflavors", "ResourceFlavor")
    if topologies is None and flavors is None:
        return Check("Kueue topologies", "OK", "Kueue is not installed (--topology-* not usable)")
    levels = {
        _name(t): [
            str(lv.get("nodeLabel")) for lv in ((t.get("spec") or {}).get("levels") or []) if isinstance(lv, dict)
        ]
        for t in topologies or []
    }
    detail = "; ".join(f"Topology {n}: {' > '.join(lv) or 'no levels'}" for n, lv in sorted(levels.items()))
    uses = [
        f"{_name(f)} -> {(f.get('spec') or {}).get('topologyName')}"
        for f in flavors or []
        if (f.get("spec") or {}).get("topologyName")
    ]
    names = ", ".join(sorted(_name(f) for f in flavors or [])) or "none"
    detail = (detail or "no Topology (--topology-* not usable)") + f"; ResourceFlavor(s) {names}"
    if uses:
        detail += f" (topology: {', '.join(uses)})"
    return Check("Kueue topologies", "OK", detail)


@_guarded("MIG slices")
def _mig(cluster: Cluster) -> Check:
    """MIG resources the nodes offer (the NVIDIA device plugin's mixed strategy): what --mig may ask for."""
    slices: dict[str, int] = {}
    for node in cluster.items(lambda: cluster.core.list_node(), "Node", namespace=None):
        for key, value in ((node.get("status") or {}).get("allocatable") or {}).items():
            if key.startswith(C.MIG_RESOURCE_PREFIX) and str(value).isdigit() and int(value):
                profile = key.removeprefix(C.MIG_RESOURCE_PREFIX)
                slices[profile] = slices.get(profile, 0) + int(value)
    if not slices:
        return Check("MIG slices", "OK", f"no node offers {C.MIG_RESOURCE_PREFIX}* (--mig not usable)")
    found = ", ".join(f"{n} x {p}" for p, n in sorted(slices.items()))
    return Check("MIG slices", "OK", f"{found}: pass --mig PROFILE")


@_guarded("GPU nodes")
def _gpus(cluster: Cluster) -> Check:
    gpu_nodes = []
    for node in cluster.items(lambda: cluster.core.list_node(), "Node", namespace=None):
        count = int(((node.get("status") or {}).get("allocatable") or {}).get(GPU, 0) or 0)
        if count:
            labels = (node.get("metadata") or {}).get("labels") or {}
            gpu_nodes.append((count, labels.get("nvidia.com/gpu.product", "unlabelled")))
    if not gpu_nodes:
        return Check(
            "GPU nodes",
            "WARN",
            f"no node has allocatable {GPU}",
            "CPU jobs only (--gpus-per-node 0); install the NVIDIA device plugin or GPU operator for GPUs",
        )
    products: dict[str, int] = {}
    for count, product in gpu_nodes:
        products[product] = products.get(product, 0) + count
    detail = ", ".join(f"{n} x {p}" for p, n in sorted(products.items()))
    return Check("GPU nodes", "OK", f"{len(gpu_nodes)} node(s): {detail}")


@_guarded("ReadWriteMany storage")
def _storage(cluster: Cluster) -> Check:
    from kubernetes import client

    storage = client.StorageV1Api(cluster.api)
    classes = cluster.items(lambda: storage.list_storage_class(), "StorageClass", namespace=None)
    rwx = [_name(sc) for sc in classes if any(p in str(sc.get("provisioner") or "").lower() for p in RWX_PROVISIONERS)]
    if not rwx:
        names = ", ".join(_name(sc) for sc in classes) or "none"
        return Check(
            "ReadWriteMany storage",
            "WARN",
            f"no storage class known to serve ReadWriteMany (have: {names})",
            "--nodes > 1 needs --pvc NAME of a shared volume, or --pod-local-storage",
        )
    return Check("ReadWriteMany storage", "OK", f"{', '.join(rwx)} (use --storage-class with --pvc-size)")


@_guarded("namespace")
def _namespace(cluster: Cluster) -> Check:
    ns = cluster.read(lambda: cluster.core.read_namespace(cluster.ns), "get", "Namespace", cluster.ns, None)
    if ns is None:
        return Check(
            "namespace", "FAIL", f"namespace {cluster.ns!r} does not exist", f"kubectl create namespace {cluster.ns}"
        )
    limits = []
    for q in cluster.items(lambda: cluster.core.list_namespaced_resource_quota(cluster.ns), "ResourceQuota"):
        hard, used = (q.get("status") or {}).get("hard") or {}, (q.get("status") or {}).get("used") or {}
        for key in (f"requests.{GPU}", "requests.cpu", "requests.memory"):
            if key in hard:
                limits.append(f"{key} {used.get(key, '0')}/{hard[key]}")
    return Check("namespace", "OK", f"{cluster.ns}" + (f"; quota {', '.join(limits)}" if limits else "; no quota"))


@_guarded("Kueue queues")
def _queues(cluster: Cluster) -> Check:
    queues = cluster.read(
        lambda: cluster.custom.list_namespaced_custom_object(C.KUEUE_GROUP, C.KUEUE_VERSION, cluster.ns, "localqueues"),
        "list",
        "LocalQueue",
    )
    if queues is None:
        return Check("Kueue queues", "OK", "Kueue is not installed (not needed)")
    names = [_name(q) for q in cluster.items_of(queues, "LocalQueue")]
    if not names:
        return Check("Kueue queues", "OK", f"Kueue is installed; no LocalQueue in {cluster.ns} (--queue not needed)")
    return Check("Kueue queues", "OK", f"LocalQueue(s) {', '.join(names)}: pass --queue NAME")


def _access(cluster: Cluster, apis: list[str]) -> list[Check]:
    """May this user create what ``submit`` creates? One SelfSubjectAccessReview per object kind."""
    wanted = [("", "configmaps"), ("", "persistentvolumeclaims")]
    wanted += [(KINDS[a].group, KINDS[a].plural) for a in apis]
    out = []
    for group, plural in wanted:
        name = f"may create {plural}"
        try:
            status = cluster.access_review("create", group, plural)
        except CliError as e:
            out.append(Check(name, "WARN", f"could not check: {e.message}", e.hint or ""))
            continue
        if status.get("allowed"):
            out.append(Check(name, "OK", f"create {plural} in {cluster.ns}: allowed"))
        else:
            why = status.get("reason") or "denied"
            out.append(
                Check(
                    name,
                    "FAIL",
                    f"create {plural} in {cluster.ns}: {why}",
                    "ask your cluster admin for a Role that allows it",
                )
            )
    return out
