"""Everything that talks to the Kubernetes API, through the official ``kubernetes`` client.

Every call goes through :func:`_call`, which turns an API or connection error into a
:class:`CliError` naming the verb, kind, namespace/name, HTTP status and reason, plus the action
that fixes it. Every request has a timeout (``--request-timeout``, 30 s, like kubectl's); reads are
retried with backoff on connection errors, 429 and 5xx; an answer that is not the API's JSON (an
HTML login page, a proxy's error) is one line. Server URLs are shown without credentials. Nothing
here prints; the CLI decides how to show results.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from operator_cli import constants as C
from operator_cli.errors import CliError

__all__ = ["Cluster", "connect", "PodInfo", "job_state", "default_namespace", "redact", "REQUEST_TIMEOUT"]

T = TypeVar("T")
REQUEST_TIMEOUT = 30.0
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_READ_VERBS = {"get", "list", "get logs of"}
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]*@")


def redact(text: str) -> str:
    """Remove ``user:password@`` from every URL in ``text``."""
    return _URL_USERINFO.sub(r"\1", text)


def _kubeconfig_path(kubeconfig: str | None) -> str | None:
    """--kubeconfig, else $KUBECONFIG (several files joined by ':' as kubectl merges them), else ~/.kube/config."""
    if kubeconfig:
        return kubeconfig
    files = [f for f in os.environ.get("KUBECONFIG", "").split(os.pathsep) if f and Path(f).is_file()]
    if files:
        return os.pathsep.join(files)
    default = Path.home() / ".kube" / "config"
    return str(default) if default.is_file() else None


def default_namespace(kubeconfig: str | None = None, context: str | None = None) -> str:
    """The namespace kubectl would use: the context's, else the pod's service account's, else default."""
    path = _kubeconfig_path(kubeconfig)
    if path and (kubeconfig is None or Path(kubeconfig).is_file()):
        try:
            from kubernetes import config

            contexts, current = config.list_kube_config_contexts(config_file=path)
            chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
            ns = ((chosen or {}).get("context") or {}).get("namespace")
            if ns:
                return str(ns)
        except Exception:  # a broken kubeconfig is reported by connect(), with the file named
            pass
    elif SERVICE_ACCOUNT_NAMESPACE.is_file():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    return "default"


def _timed_client(configuration, timeout: float):
    from kubernetes import client

    class TimedApiClient(client.ApiClient):
        def call_api(self, *args, **kwargs):
            if kwargs.get("_request_timeout") is None:
                kwargs["_request_timeout"] = (min(timeout, 10.0), timeout)
            return super().call_api(*args, **kwargs)

    api = TimedApiClient(configuration)
    api.request_timeout = timeout
    return api


def connect(kubeconfig: str | None = None, context: str | None = None, timeout: float = REQUEST_TIMEOUT):
    """An ``ApiClient`` from --kubeconfig, $KUBECONFIG, ~/.kube/config, or the pod's service account."""
    import yaml
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    path = _kubeconfig_path(kubeconfig) or str(Path.home() / ".kube" / "config")
    configuration = client.Configuration()
    try:
        if os.pathsep in path or Path(path).is_file():
            config.load_kube_config(config_file=path, context=context, client_configuration=configuration)
        elif kubeconfig:
            raise CliError(f"kubeconfig not found: {kubeconfig}", hint="pass an existing file to --kubeconfig")
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:
            raise CliError(
                "no kubeconfig found (looked at $KUBECONFIG and ~/.kube/config) and not running in a pod",
                hint="pass --kubeconfig FILE, or use `colbert-k8s render` / `colbert-k8s local` without a cluster",
            )
    except (ConfigException, ValueError, TypeError, OSError, yaml.YAMLError, AttributeError, KeyError) as e:
        first = redact(str(e).splitlines()[0] if str(e) else type(e).__name__)[:200]
        raise CliError(f"cannot use kubeconfig {path}: {first}", hint="check --context and the file") from None
    configuration.retries = 0  # _call retries reads itself, with backoff; writes are never repeated
    return _timed_client(configuration, timeout)


def _call(
    fn: Callable[[], T], verb: str, kind: str, namespace: str | None, name: str | None, host: str, timeout: float
) -> T:
    """Run one request; reads are retried 3 times (0.5, 1, 2 s) on connection errors, 429 and 5xx."""
    from urllib3.exceptions import HTTPError, ReadTimeoutError

    attempts = 4 if verb in _READ_VERBS else 1
    for attempt in range(attempts):
        try:
            return _call_once(fn, verb, kind, namespace, name, host, timeout)
        except CliError as e:
            cause = e.__cause__
            # a refused or dropped connection, 429 or 5xx may pass; a server that stalls is not asked again
            retryable = (isinstance(cause, HTTPError) and not isinstance(cause, ReadTimeoutError)) or (
                e.status is not None and (e.status == 429 or e.status >= 500)
            )
            if attempt == attempts - 1 or not retryable:
                raise
            time.sleep(0.5 * 2**attempt)
    raise AssertionError("unreachable")


def _call_once(
    fn: Callable[[], T], verb: str, kind: str, namespace: str | None, name: str | None, host: str, timeout: float
) -> T:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError, MaxRetryError, ReadTimeoutError

    host = redact(host)
    target = f"{kind} {namespace}/{name}" if name else f"{kind} in namespace {namespace}" if namespace else kind
    try:
        result = fn()
    except ApiException as e:
        reason = _reason(e)
        status = e.status
        if status in (401, 403):
            hint = (
                "your credentials expired; log in to the cluster again"
                if status == 401
                else f"ask for RBAC permission; check with `kubectl auth can-i {verb} {kind.lower()}s -n {namespace}`"
            )
            raise CliError(f"cannot {verb} {target}: {status} {reason}", hint=hint, status=status) from e
        if status == 404:
            raise CliError(f"{target} not found ({verb}: 404 {reason})", exit_code=1, status=404) from e
        if status == 429 or (status and status >= 500):
            raise CliError(f"{verb} {target} failed: {status} {reason}", status=status) from e
        if status == 409:
            raise CliError(
                f"{target} already exists (409)",
                hint="pick another --name, or remove the old job with `colbert-k8s delete NAME`",
                status=409,
            ) from e
        if status == 422:
            raise CliError(f"the API server rejected {target} as invalid (422): {reason}", status=422) from e
        raise CliError(f"{verb} {target} failed: {status} {reason}", status=status) from e
    except HTTPError as e:
        inner = e.reason if isinstance(e, MaxRetryError) and isinstance(e.reason, Exception) else e
        if isinstance(inner, ReadTimeoutError):
            raise CliError(
                f"{host} accepted the connection but did not answer {verb} {target} within {timeout:g}s",
                hint="the API server may be overloaded; retry, or raise --request-timeout",
            ) from inner
        raise CliError(
            f"cannot reach the cluster at {host} ({type(inner).__name__})",
            hint="check --context, your VPN, and `kubectl cluster-info`",
        ) from inner
    except (ValueError, TypeError, AttributeError) as e:  # a body that is not the API's JSON
        raise CliError(
            f"the server at {host} did not answer {verb} {target} like a Kubernetes API server",
            hint="check that the kubeconfig's server: is the API server (not a dashboard or a login page)",
        ) from e
    if "logs" not in verb and not isinstance(result, (dict, type(None))) and not hasattr(result, "to_dict"):
        raise CliError(
            f"the server at {host} did not answer {verb} {target} like a Kubernetes API server (got text)",
            hint="check that the kubeconfig's server: is the API server (not a dashboard or a login page)",
        )
    return result


def _reason(e) -> str:
    import json

    try:
        body = json.loads(e.body or "{}")
        message = body.get("message") or e.reason
    except ValueError:
        message = e.reason
    return redact(str(message).splitlines()[0][:300]) if message else "no reason given"


@dataclass(frozen=True)
class JobKind:
    """One training-job API: where it lives and how its pods are found."""

    api: str
    group: str
    version: str
    plural: str
    kind: str
    crd: str
    install: str
    pod_selector: str  # label whose value is the job name on its pods

    def nodes_and_gpus(self, job: dict[str, Any]) -> tuple[int, int]:
        spec = job.get("spec", {})
        if self.api == "trainjob":
            trainer = spec.get("trainer", {})
            gpus = trainer.get("resourcesPerNode", {}).get("limits", {}).get("nvidia.com/gpu", 0)
            return int(trainer.get("numNodes", 1) or 1), int(gpus or 0)
        replicas = spec.get("pytorchReplicaSpecs", {})
        containers = replicas.get("Master", {}).get("template", {}).get("spec", {}).get("containers", [{}])
        gpus = containers[0].get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0)
        return sum(r.get("replicas", 0) for r in replicas.values()), int(gpus or 0)


KINDS = {
    "pytorchjob": JobKind(
        "pytorchjob", C.GROUP, C.VERSION, C.PLURAL, C.KIND, C.CRD_NAME, C.TRAINING_OPERATOR_INSTALL, C.OPERATOR_JOB_NAME
    ),
    "trainjob": JobKind(
        "trainjob",
        C.V2_GROUP,
        C.V2_VERSION,
        C.V2_PLURAL,
        C.V2_KIND,
        C.V2_CRD_NAME,
        C.TRAINER_V2_INSTALL,
        C.JOBSET_NAME_LABEL,
    ),
}


def kind_of(job: dict[str, Any]) -> JobKind:
    return KINDS["trainjob"] if job.get("kind") == C.V2_KIND else KINDS["pytorchjob"]


def job_state(job: dict[str, Any]) -> str:
    """The newest true condition: Created, Running, Restarting, Suspended, Succeeded or Failed.

    A TrainJob's ``Complete`` is shown as ``Succeeded``, so both APIs read the same."""
    conditions = [c for c in job.get("status", {}).get("conditions", []) or [] if c.get("status") == "True"]
    types = [("Succeeded" if c.get("type") == "Complete" else c.get("type")) for c in conditions]
    for final in ("Succeeded", "Failed"):
        if final in types:
            return final
    return types[-1] if types else "Pending"


@dataclass
class PodInfo:
    name: str
    replica: str  # master-0, worker-1, ...
    rank: int  # node rank: the pod index (Master 0, Worker i -> i+1)
    phase: str
    restarts: int
    reason: str | None  # why it is pending or failing, in one line


def _pod_rank(pod) -> tuple[str, int]:
    labels = pod.metadata.labels or {}
    if C.JOBSET_NAME_LABEL in labels:  # a TrainJob's pod: node rank = the Job's completion index
        index = labels.get(C.JOB_COMPLETION_INDEX_LABEL)
        if index is None or not index.isdigit():
            parts = pod.metadata.name.split("-")  # <job>-node-0-<i>-<hash>
            index = parts[-2] if len(parts) >= 2 and parts[-2].isdigit() else "0"
        return f"node-{int(index)}", int(index)
    rtype = (labels.get(C.OPERATOR_REPLICA_TYPE) or "").lower()
    index = int(labels.get(C.OPERATOR_REPLICA_INDEX, "0") or 0)
    if not rtype:  # fall back to the operator's pod naming: <job>-master-0, <job>-worker-3
        parts = pod.metadata.name.rsplit("-", 2)
        rtype = parts[-2] if len(parts) == 3 else "pod"
        index = int(parts[-1]) if parts[-1].isdigit() else 0
    return f"{rtype}-{index}", (0 if rtype == "master" else index + 1)


def _pod_reason(pod, events: list) -> str | None:
    """One line saying why a pod is not running well, from its statuses and its events."""
    status = pod.status
    for cs in (status.container_statuses or []) if status else []:
        if (
            cs.state
            and cs.state.waiting
            and cs.state.waiting.reason not in (None, "ContainerCreating", "PodInitializing")
        ):
            msg = cs.state.waiting.message or ""
            return f"{cs.state.waiting.reason}: {msg}".strip(": ").splitlines()[0]
        if cs.state and cs.state.terminated and cs.state.terminated.reason not in (None, "Completed"):
            return f"{cs.state.terminated.reason} (exit code {cs.state.terminated.exit_code})"
        if cs.last_state and cs.last_state.terminated and cs.last_state.terminated.reason == "OOMKilled":
            return f"OOMKilled (restarted {cs.restart_count}x): raise --memory or lower the batch size"
    for cond in (status.conditions or []) if status else []:
        if cond.type == "PodScheduled" and cond.status == "False":
            message = (cond.message or "").splitlines()[0] if cond.message else ""
            return f"{cond.reason or 'Unschedulable'}: {message}".strip(": ")
    warnings = [e for e in events if e.type == "Warning"]
    if warnings:
        last = warnings[-1]
        return f"{last.reason}: {(last.message or '').splitlines()[0]}"
    return None


def _ours(meta: dict[str, Any], job: str) -> bool:
    labels = meta.get("labels") or {}
    return labels.get(C.LABEL_MANAGED_BY) == C.MANAGED_BY and labels.get(C.LABEL_INSTANCE) == job


class Cluster:
    """A thin facade over the API for one namespace."""

    def __init__(self, api_client, namespace: str):
        from kubernetes import client

        self.api = api_client
        self.ns = namespace
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.host = api_client.configuration.host
        self.timeout = getattr(api_client, "request_timeout", REQUEST_TIMEOUT)
        self.skipped: list[str] = []  # objects a command left alone, for the CLI to report

    def _c(self, fn, verb, kind, name=None, namespace: str | None = "") -> Any:
        return _call(fn, verb, kind, self.ns if namespace == "" else namespace, name, self.host, self.timeout)

    # ---- preflight -------------------------------------------------------------------------
    def serves(self, kind: JobKind) -> bool:
        """Whether the API server serves this kind's CRD (a 404 on listing it means no)."""
        try:
            self._c(
                lambda: self.custom.list_namespaced_custom_object(
                    kind.group, kind.version, self.ns, kind.plural, limit=1
                ),
                "list",
                kind.kind,
            )
            return True
        except CliError as e:
            if e.status == 404:
                return False
            raise

    def detect_api(self) -> str:
        """``--api auto``: TrainJob when Trainer v2 is served (preferred, the current API), else PyTorchJob."""
        v2, v1 = self.serves(KINDS["trainjob"]), self.serves(KINDS["pytorchjob"])
        if not (v1 or v2):
            raise CliError(
                f"this cluster serves neither {C.V2_CRD_NAME} (Kubeflow Trainer v2) nor {C.CRD_NAME} "
                "(Training Operator v1)",
                hint=f"install Trainer v2 with: {C.TRAINER_V2_INSTALL}",
            )
        return "trainjob" if v2 else "pytorchjob"

    def preflight(self, api: str, secrets: list[str], claim: str | None, runtime: str | None = None) -> None:
        """The checks that turn a confusing half-created job into one clear line, before creating anything."""
        kind = KINDS[api]
        if not self.serves(kind):
            other = KINDS["pytorchjob" if api == "trainjob" else "trainjob"]
            served = self.serves(other)
            product = "Kubeflow Trainer v2" if api == "trainjob" else "the Kubeflow Training Operator"
            raise CliError(
                f"{product} is not installed: the API has no {kind.crd} ({kind.group}/{kind.version})"
                + (f"; it serves {other.kind} (--api {other.api})" if served else ""),
                hint=f"pass --api {other.api} or --api auto" if served else f"install it with: {kind.install}",
            )
        if api == "trainjob":
            self._check_runtime(runtime or C.V2_DEFAULT_RUNTIME)
        self._must_exist(
            lambda: self.core.read_namespace(self.ns),
            "Namespace",
            self.ns,
            None,
            f"namespace {self.ns!r} does not exist",
            f"kubectl create namespace {self.ns}",
        )
        for secret in secrets:
            self._must_exist(
                lambda s=secret: self.core.read_namespaced_secret(s, self.ns),
                "Secret",
                secret,
                self.ns,
                f"Secret {self.ns}/{secret} does not exist (referenced by --secret-env/--image-pull-secret)",
                f"kubectl create secret generic {secret} -n {self.ns} --from-literal=KEY=...",
            )
        if claim:
            self._must_exist(
                lambda: self.core.read_namespaced_persistent_volume_claim(claim, self.ns),
                "PersistentVolumeClaim",
                claim,
                self.ns,
                f"PersistentVolumeClaim {self.ns}/{claim} does not exist",
                "create it first, or use --pvc-size to have one created",
            )

    def _check_runtime(self, name: str) -> None:
        """The ClusterTrainingRuntime exists and runs torch (its framework label or its mlPolicy)."""
        try:
            runtime = self._c(
                lambda: self.custom.get_cluster_custom_object(C.V2_GROUP, C.V2_VERSION, C.V2_RUNTIME_PLURAL, name),
                "get",
                C.V2_RUNTIME_KIND,
                name,
                namespace=None,
            )
        except CliError as e:
            if e.status == 404:
                raise CliError(
                    f"ClusterTrainingRuntime {name!r} does not exist",
                    hint="list them with `kubectl get clustertrainingruntimes`; the stock one is "
                    f"{C.V2_DEFAULT_RUNTIME} ({C.TRAINER_V2_INSTALL})",
                ) from e
            if e.status == 403:
                return  # may create TrainJobs without reading runtimes: the controller will tell
            raise
        labels = (runtime.get("metadata") or {}).get("labels") or {}
        policy = (runtime.get("spec") or {}).get("mlPolicy") or {}
        framework = labels.get(C.V2_FRAMEWORK_LABEL)
        if framework != "torch" and "torch" not in policy:
            raise CliError(
                f"ClusterTrainingRuntime {name!r} is for {framework or 'another framework'}, not torch "
                "(colbert-train is started by torchrun)",
                hint=f"pick a torch runtime, e.g. --runtime {C.V2_DEFAULT_RUNTIME}",
            )

    def _must_exist(self, fn, kind: str, name: str, namespace: str | None, missing: str, hint: str) -> None:
        """404 becomes ``missing``; 403 skips the check (many users may create jobs but not read
        namespaces or Secrets, and the pods can still use them); anything else is reported."""
        try:
            self._c(fn, "get", kind, name, namespace=namespace)
        except CliError as e:
            if e.status == 404:
                raise CliError(missing, hint=hint) from e
            if e.status != 403:
                raise

    # ---- create / delete -------------------------------------------------------------------
    def _create_one(self, obj: dict[str, Any]) -> dict[str, Any]:
        kind, name = obj["kind"], obj["metadata"]["name"]
        if kind == "ConfigMap":
            fn = lambda: self.core.create_namespaced_config_map(self.ns, obj)
        elif kind == "PersistentVolumeClaim":
            fn = lambda: self.core.create_namespaced_persistent_volume_claim(self.ns, obj)
        elif kind in (C.KIND, C.V2_KIND):
            k = kind_of(obj)
            fn = lambda: self.custom.create_namespaced_custom_object(k.group, k.version, self.ns, k.plural, obj)
        else:
            raise CliError(f"cannot create objects of kind {kind}")
        result = self._c(fn, "create", kind, name)
        return result if isinstance(result, dict) else self.api.sanitize_for_serialization(result) or obj

    def _delete_one(self, kind: str, name: str) -> bool:
        """Delete; False when it was already gone."""
        if kind == "ConfigMap":
            fn = lambda: self.core.delete_namespaced_config_map(name, self.ns)
        elif kind == "PersistentVolumeClaim":
            fn = lambda: self.core.delete_namespaced_persistent_volume_claim(name, self.ns)
        else:
            k = KINDS["trainjob"] if kind == C.V2_KIND else KINDS["pytorchjob"]
            fn = lambda: self.custom.delete_namespaced_custom_object(
                k.group, k.version, self.ns, k.plural, name, propagation_policy="Foreground"
            )
        try:
            self._c(fn, "delete", kind, name)
            return True
        except CliError as e:
            if e.status == 404:  # 404: nothing to remove
                return False
            raise

    def create_all(self, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Create in order; if one is refused, remove the ones just created (all-or-nothing)."""
        created: list[dict[str, Any]] = []
        try:
            for obj in objects:
                created.append(self._create_one(obj))
        except CliError as e:
            rolled = [f"{o['kind']} {o['metadata']['name']}" for o in reversed(created)]
            for obj in reversed(created):
                self._delete_one(obj["kind"], obj["metadata"]["name"])
            if rolled:
                e.message += f"; rolled back {', '.join(rolled)}"
            raise
        job = created[-1]
        uid = job.get("metadata", {}).get("uid")
        if uid:  # let Kubernetes GC the ConfigMap with the job (the workspace PVC is kept: it holds the model)
            k = kind_of(job)
            owner = {
                "apiVersion": f"{k.group}/{k.version}",
                "kind": k.kind,
                "name": job["metadata"]["name"],
                "uid": uid,
                "blockOwnerDeletion": False,
            }
            cm = objects[0]["metadata"]["name"]
            self._c(
                lambda: self.core.patch_namespaced_config_map(cm, self.ns, {"metadata": {"ownerReferences": [owner]}}),
                "patch",
                "ConfigMap",
                cm,
            )
        return created

    def delete_job(self, name: str, keep_storage: bool) -> list[str]:
        """Remove the job and what this tool created for it (and nothing else); returns what was removed.

        Every object is read first and deleted only if it carries this tool's managed-by label and
        belongs to this job: a same-named object made by someone else is left alone and reported."""
        kind = kind_of(self.get_own_job(name))
        if not self._delete_one(kind.kind, name):
            raise CliError(f"{kind.kind} {self.ns}/{name} not found", hint="see `colbert-k8s list`", exit_code=1)
        removed = [f"{kind.kind} {name}"]
        extra = [("ConfigMap", f"{name}-config")]
        if not keep_storage:
            extra.append(("PersistentVolumeClaim", f"{name}-workspace"))
        for kind, obj_name in extra:
            meta = self._metadata(kind, obj_name)
            if meta is None:
                continue
            if not _ours(meta, name):
                self.skipped.append(f"{kind} {obj_name} (not created by colbert-k8s for {name}; left alone)")
                continue
            if self._delete_one(kind, obj_name):
                removed.append(f"{kind} {obj_name}")
        return removed

    def _metadata(self, kind: str, name: str) -> dict[str, Any] | None:
        read = {
            "ConfigMap": lambda: self.core.read_namespaced_config_map(name, self.ns),
            "PersistentVolumeClaim": lambda: self.core.read_namespaced_persistent_volume_claim(name, self.ns),
        }[kind]
        try:
            obj = self._c(read, "get", kind, name)
        except CliError as e:
            if e.status == 404:
                return None
            raise
        obj = obj if isinstance(obj, dict) else self.api.sanitize_for_serialization(obj)
        return obj.get("metadata") or {}

    # ---- read ------------------------------------------------------------------------------
    def get_own_job(self, name: str) -> dict[str, Any]:
        """The job, if this tool created it; another tool's job of that name is one line, exit 1."""
        job = self.get_job(name)
        if not _ours(job.get("metadata") or {}, name):
            raise CliError(
                f"{job.get('kind', C.KIND)} {self.ns}/{name} was not created by colbert-k8s "
                f"(no {C.LABEL_MANAGED_BY}={C.MANAGED_BY} label); not touching it",
                hint="use kubectl for jobs other tools manage",
                exit_code=1,
            )
        return job

    def get_job(self, name: str) -> dict[str, Any]:
        """The PyTorchJob or TrainJob called ``name`` (a kind the cluster does not serve counts as absent)."""
        for kind in KINDS.values():
            try:
                job = self._c(
                    lambda k=kind: self.custom.get_namespaced_custom_object(
                        k.group, k.version, self.ns, k.plural, name
                    ),
                    "get",
                    kind.kind,
                    name,
                )
                job.setdefault("kind", kind.kind)
                return job
            except CliError as e:
                if e.status != 404:
                    raise
        raise CliError(
            f"PyTorchJob or TrainJob {self.ns}/{name} not found", hint="see `colbert-k8s list`", exit_code=1, status=404
        )

    def list_jobs(self, all_namespaces: bool = False) -> list[dict[str, Any]]:
        """This tool's jobs of both kinds; a kind the cluster does not serve is skipped."""
        selector = f"{C.LABEL_MANAGED_BY}={C.MANAGED_BY}"
        items: list[dict[str, Any]] = []
        for kind in KINDS.values():
            if all_namespaces:
                fn = lambda k=kind: self.custom.list_cluster_custom_object(
                    k.group, k.version, k.plural, label_selector=selector
                )
            else:
                fn = lambda k=kind: self.custom.list_namespaced_custom_object(
                    k.group, k.version, self.ns, k.plural, label_selector=selector
                )
            try:
                res = self._c(fn, "list", kind.kind, namespace=None if all_namespaces else "")
            except CliError as e:
                if e.status == 404:
                    continue
                raise
            for job in res.get("items", []):
                job.setdefault("kind", kind.kind)
                items.append(job)
        # the selector is applied again here: an API that ignores it must not make us list other tools' jobs
        return [j for j in items if (j.get("metadata", {}).get("labels") or {}).get(C.LABEL_MANAGED_BY) == C.MANAGED_BY]

    def pods(self, job: str, kind: JobKind | None = None) -> list[PodInfo]:
        """The job's pods (the operator's for a PyTorchJob, the JobSet's for a TrainJob), by node rank."""
        label = (kind or KINDS["pytorchjob"]).pod_selector
        selector = f"{label}={job}"
        res = self._c(lambda: self.core.list_namespaced_pod(self.ns, label_selector=selector), "list", "Pod")
        events = self._events()
        out = []
        for pod in res.items:
            if (pod.metadata.labels or {}).get(label) != job:
                continue
            replica, rank = _pod_rank(pod)
            statuses = (pod.status.container_statuses or []) if pod.status else []
            restarts = sum(cs.restart_count or 0 for cs in statuses)
            phase = (pod.status.phase if pod.status else None) or "Unknown"
            pod_events = [e for e in events if e.involved_object and e.involved_object.name == pod.metadata.name]
            reason = _pod_reason(pod, pod_events) if phase != "Succeeded" else None
            out.append(PodInfo(pod.metadata.name, replica, rank, phase, restarts, reason))
        return sorted(out, key=lambda p: p.rank)

    def _events(self) -> list:
        from kubernetes.client.exceptions import ApiException

        try:
            items = self.core.list_namespaced_event(self.ns).items
        except ApiException:  # events are a nicety: no permission or no resource must not break status
            return []
        return sorted(items, key=lambda e: str(e.last_timestamp or e.event_time or ""))

    def log_lines(self, pod: str, follow: bool = False) -> Iterator[str]:
        if not follow:
            text = self._c(
                lambda: self.core.read_namespaced_pod_log(pod, self.ns, container=C.CONTAINER),
                "get logs of",
                "Pod",
                pod,
            )
            yield from (text or "").splitlines()
            return
        resp = self._c(
            lambda: self.core.read_namespaced_pod_log(
                pod,
                self.ns,
                container=C.CONTAINER,
                follow=True,
                _preload_content=False,
                _request_timeout=(10, 24 * 3600),  # a quiet log is not a stalled server; the poller checks that
            ),
            "follow logs of",
            "Pod",
            pod,
        )
        buf = b""
        for chunk in resp.stream(4096):
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                yield line.decode("utf-8", "replace")
        if buf:
            yield buf.decode("utf-8", "replace")
