"""Operations on one namespace: preflight, create all-or-nothing, delete only what this tool made, read.

Every request goes through :func:`operator_cli.kube.transport.call`. Nothing here prints; the CLI
decides how to show results.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from operator_cli import constants as C
from operator_cli.errors import CliError
from operator_cli.kube.kinds import KINDS, JobKind, kind_of, masterless, shape_problem
from operator_cli.kube.pods import PodInfo, pod_rank, pod_reason
from operator_cli.kube.transport import NOT_THE_API_SERVER, call, redact
from operator_cli.lines import text_lines

__all__ = ["Cluster"]


def _ours(obj: dict[str, Any], job: str) -> bool:
    labels = _labels(obj)
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
        self.timeout = getattr(api_client, "request_timeout", C.REQUEST_TIMEOUT)
        self.skipped: list[str] = []  # objects a command left alone, for the CLI to report

    def _c(self, fn, verb, kind, name=None, namespace: str | None = "") -> Any:
        return call(fn, verb, kind, self.ns if namespace == "" else namespace, name, self.host, self.timeout)

    def items(self, fn, kind: str, namespace: str | None = "") -> list[dict[str, Any]]:
        """A list read's items as plain dicts (none when the resource is not there); a list without a list of
        objects in ``items`` is one line (Go writes an empty slice as null, which is an empty list)."""
        return self.items_of(self.read(fn, "list", kind, namespace=namespace) or {"items": []}, kind)

    def items_of(self, answer: dict[str, Any], kind: str) -> list[dict[str, Any]]:
        """The items of a list answer already read (see :meth:`items`)."""
        found = answer.get("items", "no items")
        found = [] if found is None else found
        if not isinstance(found, list) or not all(isinstance(i, dict) for i in found):
            raise CliError(
                f"the server at {redact(self.host)} answered list {kind} without a list of objects in items, "
                "unlike a Kubernetes API server",
                hint=NOT_THE_API_SERVER,
            )
        return found

    def read(self, fn, verb: str, kind: str, name: str | None = None, namespace: str | None = "") -> dict | None:
        """One read as a plain dict; None when the object (or the resource) is not there (404)."""
        try:
            obj = self._c(fn, verb, kind, name, namespace=namespace)
        except CliError as e:
            if e.status == 404:
                return None
            raise
        return obj if isinstance(obj, dict) or obj is None else self.api.sanitize_for_serialization(obj)

    def own_config_map(self, cm: str, job: dict[str, Any] | None) -> None:
        """Make ``job`` the ConfigMap's owner, so Kubernetes removes it with the job; ``None`` disowns it
        (before the job is deleted and recreated, which would otherwise take the ConfigMap along)."""
        owners = []
        if job is not None:
            k = kind_of(job)
            owners = [{"apiVersion": f"{k.group}/{k.version}", "kind": k.kind, "name": job["metadata"]["name"],
                       "uid": job["metadata"]["uid"], "blockOwnerDeletion": False}]  # fmt: skip
        self._c(
            lambda: self.core.patch_namespaced_config_map(cm, self.ns, {"metadata": {"ownerReferences": owners}}),
            "patch",
            "ConfigMap",
            cm,
        )

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
                    hint=f"`colbert-k8s runtime install` installs {C.V2_SHIPPED_RUNTIME}; the stock one is "
                    f"{C.V2_STOCK_RUNTIME} ({C.TRAINER_V2_INSTALL})",
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
                hint=f"pick a torch runtime, e.g. --runtime {C.V2_SHIPPED_RUNTIME} (`colbert-k8s runtime install`)",
            )

    def runtime_exists(self, name: str) -> bool:
        """Whether the ClusterTrainingRuntime is there; a user who may not read runtimes is told by preflight."""
        found = self.read(
            lambda: self.custom.get_cluster_custom_object(C.V2_GROUP, C.V2_VERSION, C.V2_RUNTIME_PLURAL, name),
            "get",
            C.V2_RUNTIME_KIND,
            name,
            namespace=None,
        )
        return found is not None

    def suspend_job(self, name: str, suspend: bool) -> tuple[str, bool]:
        """Suspend or resume a job this tool created, by a merge patch of its kind's field (PyTorchJob
        ``spec.runPolicy.suspend``, TrainJob ``spec.suspend``); returns (kind, whether it changed)."""
        job = self.get_own_job(name)
        k = kind_of(job)
        spec = job.get("spec") or {}
        now = bool((spec.get("runPolicy") or {}).get("suspend") if k.api == "pytorchjob" else spec.get("suspend"))
        if now == suspend:
            return k.kind, False
        field = {"runPolicy": {"suspend": suspend}} if k.api == "pytorchjob" else {"suspend": suspend}
        body = {"spec": field}  # a dict: the client sends it as application/merge-patch+json
        self._c(
            lambda: self.custom.patch_namespaced_custom_object(k.group, k.version, self.ns, k.plural, name, body),
            "patch",
            k.kind,
            name,
        )
        return k.kind, True

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
        elif kind == "Pod":
            fn = lambda: self.core.create_namespaced_pod(self.ns, obj)
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
        elif kind == "Pod":
            fn = lambda: self.core.delete_namespaced_pod(name, self.ns)
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

    def create_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """One pod of this tool's own (``fetch``'s), rendered and labelled like every object it creates."""
        return self._create_one(pod)

    def delete_pod(self, name: str) -> bool:
        """Delete a pod this tool created; False when it was already gone."""
        return self._delete_one("Pod", name)

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
        if job.get("metadata", {}).get("uid"):  # the ConfigMap goes with the job (the PVC stays: it holds the model)
            self.own_config_map(objects[0]["metadata"]["name"], job)
        return created

    def delete_job(self, name: str, keep_storage: bool) -> list[str]:
        """Remove the job and what this tool created for it (and nothing else); returns what was removed.

        Every object is read first and deleted only if it carries this tool's managed-by label and
        belongs to this job: a same-named object made by someone else is left alone and reported."""
        kind = kind_of(self.get_own_job(name))
        extra = [("ConfigMap", f"{name}-config")]
        if not keep_storage:
            extra.append(("PersistentVolumeClaim", f"{name}-workspace"))
        found = {key: self._object(*key) for key in extra}  # before the job goes: GC takes what it owns
        if not self._delete_one(kind.kind, name):
            raise CliError(f"{kind.kind} {self.ns}/{name} not found", hint="see `colbert-k8s list`", exit_code=1)
        removed = [f"{kind.kind} {name}"] + self._delete_fetch_pods(name)
        for (kind, obj_name), obj in found.items():
            if obj is None:
                continue
            if not _ours(obj, name):
                self.skipped.append(f"{kind} {obj_name} (not created by colbert-k8s for {name}; left alone)")
                continue
            # an object the job owned may already be gone with it (Kubernetes' garbage collector): removed all the same
            if self._delete_one(kind, obj_name) or self._object(kind, obj_name) is None:
                removed.append(f"{kind} {obj_name}")
        return removed

    def _delete_fetch_pods(self, name: str) -> list[str]:
        """A ``fetch`` pod left by a killed CLI (by its labels; the job's garbage collection may take it too)."""
        selector = f"{C.LABEL_INSTANCE}={name},{C.LABEL_MANAGED_BY}={C.MANAGED_BY},{C.LABEL_COMPONENT}=fetch"
        try:
            pods = self.items(lambda: self.core.list_namespaced_pod(self.ns, label_selector=selector), "Pod")
        except CliError as e:
            self.skipped.append(f"any fetch pod of {name} (cannot list pods: {e.message})")
            return []
        ours = [p["metadata"]["name"] for p in pods if _ours(p, name) and _labels(p).get(C.LABEL_COMPONENT) == "fetch"]
        return [f"Pod {pod}" for pod in ours if self._delete_one("Pod", pod)]

    def _object(self, kind: str, name: str) -> dict[str, Any] | None:
        fn = {
            "ConfigMap": lambda: self.core.read_namespaced_config_map(name, self.ns),
            "PersistentVolumeClaim": lambda: self.core.read_namespaced_persistent_volume_claim(name, self.ns),
        }[kind]
        return self.read(fn, "get", kind, name)

    # ---- read ------------------------------------------------------------------------------
    def get_own_job(self, name: str) -> dict[str, Any]:
        """The job, if this tool created it; another tool's job of that name is one line, exit 1."""
        job = self.get_job(name)
        if not _ours(job, name):
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
                self._well_formed(job, f"get {kind.kind} {self.ns}/{name}")
                job.setdefault("kind", kind.kind)
                return job
            except CliError as e:
                if e.status != 404:
                    raise
        raise CliError(
            f"PyTorchJob or TrainJob {self.ns}/{name} not found", hint="see `colbert-k8s list`", exit_code=1, status=404
        )

    def _well_formed(self, job: Any, answered: str) -> None:
        if problem := shape_problem(job):
            raise CliError(
                f"the server at {redact(self.host)} answered {answered} with a malformed job ({problem}), "
                "unlike a Kubernetes API server",
                hint=NOT_THE_API_SERVER,
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
            for job in self.items(fn, kind.kind, namespace=None if all_namespaces else ""):  # a kind not served: none
                self._well_formed(job, f"list {kind.kind}")
                job.setdefault("kind", kind.kind)
                items.append(job)
        # the selector is applied again here: an API that ignores it must not make us list other tools' jobs
        return [j for j in items if _labels(j).get(C.LABEL_MANAGED_BY) == C.MANAGED_BY and _named(j)]

    def pods(self, job: dict[str, Any]) -> list[PodInfo]:
        """The job's pods (the operator's for a PyTorchJob, the JobSet's for a TrainJob), by node rank.

        Takes the job object, not its name: its kind says which label finds the pods, and its replica
        specs how they are numbered (a job of Workers only counts from worker-0)."""
        name, no_master = job["metadata"]["name"], masterless(job)
        label = kind_of(job).pod_selector
        selector = f"{label}={name}"
        res = self._c(lambda: self.core.list_namespaced_pod(self.ns, label_selector=selector), "list", "Pod")
        events = self._events()
        out = []
        for pod in res.items:
            if (pod.metadata.labels or {}).get(label) != name:
                continue
            replica, rank = pod_rank(pod, no_master)
            statuses = (pod.status.container_statuses or []) if pod.status else []
            restarts = sum(cs.restart_count or 0 for cs in statuses)
            phase = (pod.status.phase if pod.status else None) or "Unknown"
            pod_events = [e for e in events if e.involved_object and e.involved_object.name == pod.metadata.name]
            reason = pod_reason(pod, pod_events) if phase != "Succeeded" else None
            out.append(PodInfo(pod.metadata.name, replica, rank, phase, restarts, reason))
        return sorted(out, key=lambda p: p.rank)

    def _events(self) -> list:
        try:
            items = self._c(lambda: self.core.list_namespaced_event(self.ns), "list", "Event").items
        except CliError:  # events are a nicety: no permission, no resource or a malformed answer must not break status
            return []
        return sorted(items, key=lambda e: str(e.last_timestamp or e.event_time or ""))

    def log_lines(self, pod: str, kind: JobKind, follow: bool = False, **query: Any) -> Iterator[str]:
        """The trainer container's log (``kind.container``: the API server refuses another name).

        ``query``: the API's own log options (``tail_lines``, ``since_seconds``, ``previous``,
        ``timestamps``), passed as given."""
        options = {k: v for k, v in query.items() if v not in (None, False)}
        if not follow:
            text = self._c(
                lambda: self.core.read_namespaced_pod_log(pod, self.ns, container=kind.container, **options),
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
                container=kind.container,
                follow=True,
                _preload_content=False,
                _request_timeout=(10, 24 * 3600),  # a quiet log is not a stalled server; the poller checks that
                **options,
            ),
            "follow logs of",
            "Pod",
            pod,
        )
        yield from text_lines(resp.stream(4096))


def _labels(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    return labels if isinstance(labels, dict) else {}


def _named(obj: dict[str, Any]) -> bool:
    return isinstance(obj["metadata"].get("name"), str)
