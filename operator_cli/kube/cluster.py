"""Operations on one namespace: preflight, create all-or-nothing, delete only what this tool made, read.

:class:`Cluster` is the one way the commands (``submit``, ``status``, ``resize``, ``doctor``, ``fetch``,
``runtime`` ...) reach the API: every request goes through :meth:`Cluster.request`
(:func:`operator_cli.kube.transport.call`: timeouts, one-line errors). A TrainJob's runtime (check, fall back
to the stock one, install) is :mod:`operator_cli.kube.runtime`'s. What differs between job kinds is
asked of the kind (:mod:`operator_cli.kube.kinds`); derived names come from :mod:`operator_cli.kube.names`.
Nothing here prints; the CLI decides how to show results.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import operator_cli.kube.names as names
from operator_cli import constants as C
from operator_cli.errors import CliError
from operator_cli.kube.kinds import AUTO_ORDER, KINDS, JobKind, kind_named, kind_of, shape_problem, sweep_named
from operator_cli.kube.pods import PodInfo, status_reason, warning_reason
from operator_cli.kube.runtime import check_runtime
from operator_cli.kube.transport import NOT_THE_API_SERVER, call, redact
from operator_cli.lines import text_lines

__all__ = ["Cluster"]

# the core objects this tool creates and deletes, by kind: the CoreV1Api methods' suffix
VERBS = ("create", "read", "delete")
_CORE = {"ConfigMap": "config_map", "Pod": "pod", "PersistentVolumeClaim": "persistent_volume_claim"}


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

    def request(self, fn, verb: str, kind: str, name: str | None = None, namespace: str | None = "") -> Any:
        """``fn()``, one API request, with this cluster's timeout; an error is one line naming ``verb``, ``kind``
        and namespace/name (``namespace`` "": this cluster's, None: cluster-scoped)."""
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
            obj = self.request(fn, verb, kind, name, namespace=namespace)
        except CliError as e:
            if e.status == 404:
                return None
            raise
        return obj if isinstance(obj, dict) or obj is None else self.api.sanitize_for_serialization(obj)

    def own_config_map(self, job_name: str, job: dict[str, Any] | None) -> None:
        """Make ``job`` its ConfigMap's owner, so Kubernetes removes it with the job; ``None`` disowns it
        (before the job is deleted and recreated, which would otherwise take the ConfigMap along)."""
        cm = names.config_map(job_name)
        owners = []
        if job is not None:
            k = kind_of(job)
            owners = [
                {
                    "apiVersion": job.get("apiVersion", k.api_version),
                    "kind": job.get("kind", k.kind),
                    "name": job["metadata"]["name"],
                    "uid": job["metadata"]["uid"],
                    "blockOwnerDeletion": False,
                }
            ]
        body = {"metadata": {"ownerReferences": owners}}
        self.request(lambda: self.core.patch_namespaced_config_map(cm, self.ns, body), "patch", "ConfigMap", cm)

    def config_text(self, job_name: str) -> str | None:
        """The training config the job's pods run with (its ConfigMap's ``train.yaml``); None when it is not there."""
        obj = self.object("ConfigMap", names.config_map(job_name))
        text = ((obj or {}).get("data") or {}).get(C.CONFIG_FILE)
        return text if isinstance(text, str) else None

    # ---- preflight -------------------------------------------------------------------------
    def serves(self, kind: JobKind) -> bool:
        """Whether the API server serves this kind's CRD (a 404 on listing it means no)."""
        try:
            self.request(lambda: kind.list(self.custom, self.ns, "", limit=1), "list", kind.kind)
            return True
        except CliError as e:
            if e.status == 404:
                return False
            raise

    def detect_api(self) -> str:
        """``--api auto``: the first kind of :data:`AUTO_ORDER` the cluster serves (Trainer v2 first)."""
        for api in AUTO_ORDER:
            if self.serves(KINDS[api]):
                return api
        first, served = KINDS[AUTO_ORDER[0]], [f"{KINDS[a].crd} ({KINDS[a].product})" for a in AUTO_ORDER]
        raise CliError(
            f"this cluster serves neither {' nor '.join(served)}", hint=f"install {first.product} with: {first.install}"
        )

    def preflight(self, api: str, secrets: list[str], claim: str | None, runtime: str | None = None) -> None:
        """The checks that turn a confusing half-created job into one clear line, before creating anything."""
        kind = KINDS[api]
        if not self.serves(kind):
            other = next((k for k in KINDS.values() if k is not kind and self.serves(k)), None)
            raise CliError(
                f"{kind.product} is not installed: the API has no {kind.crd} ({kind.api_version})"
                + (f"; it serves {other.kind} (--api {other.api})" if other else ""),
                hint=f"pass --api {other.api} or --api auto" if other else f"install it with: {kind.install}",
            )
        if kind.uses_runtime:
            check_runtime(self, runtime or C.V2_DEFAULT_RUNTIME)
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

    def access_review(self, verb: str, group: str, plural: str) -> dict[str, Any]:
        """May this user ``verb`` ``plural`` of ``group`` in this namespace? The SelfSubjectAccessReview's status."""
        from kubernetes import client

        attributes = {"namespace": self.ns, "verb": verb, "group": group, "resource": plural}
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }
        auth = client.AuthorizationV1Api(self.api)
        review = self.request(
            lambda: auth.create_self_subject_access_review(body), "create", "SelfSubjectAccessReview", namespace=None
        )
        review = review if isinstance(review, dict) else self.api.sanitize_for_serialization(review)
        return review.get("status") or {}

    def suspend_job(self, name: str, suspend: bool) -> tuple[str, bool]:
        """Suspend or resume a job this tool created, by a merge patch of its kind's field (PyTorchJob
        ``spec.runPolicy.suspend``, TrainJob ``spec.suspend``); returns (kind, whether it changed)."""
        job = self.get_own_job(name)
        k = kind_of(job)
        if k.suspended(job) == suspend:
            return k.kind, False
        body = {"spec": k.suspend_patch(suspend)}  # a dict: the client sends it as application/merge-patch+json
        self.request(lambda: k.patch(self.custom, self.ns, name, body), "patch", k.kind, name)
        return k.kind, True

    def _must_exist(self, fn, kind: str, name: str, namespace: str | None, missing: str, hint: str) -> None:
        """404 becomes ``missing``; 403 skips the check (many users may create jobs but not read
        namespaces or Secrets, and the pods can still use them); anything else is reported."""
        try:
            self.request(fn, "get", kind, name, namespace=namespace)
        except CliError as e:
            if e.status == 404:
                raise CliError(missing, hint=hint) from e
            if e.status != 403:
                raise

    # ---- create / delete -------------------------------------------------------------------
    def _verbs(self, kind: str) -> tuple[Any, Any, Any]:
        """(create(obj), get(name), delete(name)) for ``kind``: a core object's CoreV1Api calls, or a job kind's."""
        if job_kind := kind_named(kind) or sweep_named(kind):  # a sweep (tune) is created and deleted alike
            return (
                lambda obj: job_kind.create(self.custom, self.ns, obj),
                lambda name: job_kind.get(self.custom, self.ns, name),
                lambda name: job_kind.delete(self.custom, self.ns, name),
            )
        if kind not in _CORE:
            raise CliError(f"cannot create objects of kind {kind}")
        create, read, delete = (getattr(self.core, f"{verb}_namespaced_{_CORE[kind]}") for verb in VERBS)
        return lambda obj: create(self.ns, obj), lambda name: read(name, self.ns), lambda name: delete(name, self.ns)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create one object of this tool's (a ConfigMap, a PVC, a job of any kind, ``fetch``'s pod); returns
        the object as stored."""
        kind, name = obj["kind"], obj["metadata"]["name"]
        create = self._verbs(kind)[0]
        result = self.request(lambda: create(obj), "create", kind, name)
        return result if isinstance(result, dict) else self.api.sanitize_for_serialization(result) or obj

    def delete(self, kind: str, name: str) -> bool:
        """Delete one object (a job in the foreground: its pods first); False when it was already gone."""
        delete = self._verbs(kind)[2]
        try:
            self.request(lambda: delete(name), "delete", kind, name)
            return True
        except CliError as e:
            if e.status == 404:  # 404: nothing to remove
                return False
            raise

    def object(self, kind: str, name: str) -> dict[str, Any] | None:
        """One object of ``kind`` (core or a job kind) as a plain dict; None when it is not there."""
        read = self._verbs(kind)[1]
        return self.read(lambda: read(name), "get", kind, name)

    def create_all(self, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Create in order; if one is refused, remove the ones just created (all-or-nothing)."""
        created: list[dict[str, Any]] = []
        try:
            for obj in objects:
                created.append(self.create(obj))
        except CliError as e:
            rolled = [f"{o['kind']} {o['metadata']['name']}" for o in reversed(created)]
            for obj in reversed(created):
                self.delete(obj["kind"], obj["metadata"]["name"])
            if rolled:
                e.message += f"; rolled back {', '.join(rolled)}"
            raise
        job = created[-1]
        if job.get("metadata", {}).get("uid"):  # the ConfigMap goes with the job (the PVC stays: it holds the model)
            self.own_config_map(job["metadata"]["name"], job)
        return created

    def delete_job(self, name: str, keep_storage: bool) -> list[str]:
        """Remove the job and what this tool created for it (and nothing else); returns what was removed.

        Every object is read first and deleted only if it carries this tool's managed-by label and
        belongs to this job: a same-named object made by someone else is left alone and reported."""
        kind = kind_of(self.get_own_job(name))
        extra = [("ConfigMap", names.config_map(name))]
        if not keep_storage:
            extra.append(("PersistentVolumeClaim", names.created_claim(name)))
        found = {key: self.object(*key) for key in extra}  # before the job goes: GC takes what it owns
        if not self.delete(kind.kind, name):
            raise CliError(f"{kind.kind} {self.ns}/{name} not found", hint="see `colbert-k8s list`", exit_code=1)
        removed = [f"{kind.kind} {name}"] + self._delete_fetch_pods(name)
        for (kind, obj_name), obj in found.items():
            if obj is None:
                continue
            if not _ours(obj, name):
                self.skipped.append(f"{kind} {obj_name} (not created by colbert-k8s for {name}; left alone)")
                continue
            # an object the job owned may already be gone with it (Kubernetes' garbage collector): removed all the same
            if self.delete(kind, obj_name) or self.object(kind, obj_name) is None:
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
        return [f"Pod {pod}" for pod in ours if self.delete("Pod", pod)]

    # ---- read ------------------------------------------------------------------------------
    def get_own_job(self, name: str) -> dict[str, Any]:
        """The job, if this tool created it; another tool's job of that name is one line, exit 1."""
        job = self.get_job(name)
        if not _ours(job, name):
            raise CliError(
                f"{job['kind']} {self.ns}/{name} was not created by colbert-k8s "
                f"(no {C.LABEL_MANAGED_BY}={C.MANAGED_BY} label); not touching it",
                hint="use kubectl for jobs other tools manage",
                exit_code=1,
            )
        return job

    def get_job(self, name: str) -> dict[str, Any]:
        """The job called ``name``, of whichever kind it is (a kind the cluster does not serve counts as absent)."""
        for kind in KINDS.values():
            try:
                job = self.request(lambda k=kind: k.get(self.custom, self.ns, name), "get", kind.kind, name)
                self._well_formed(job, f"get {kind.kind} {self.ns}/{name}")
                job.setdefault("kind", kind.kind)
                return job
            except CliError as e:
                if e.status != 404:
                    raise
        raise CliError(
            f"{' or '.join(KINDS[a].kind for a in KINDS)} {self.ns}/{name} not found",
            hint="see `colbert-k8s list`",
            exit_code=1,
            status=404,
        )

    def job_exists(self, name: str) -> bool:
        """Whether a job called ``name`` is there (still, while a foreground delete removes its pods)."""
        try:
            self.get_job(name)
            return True
        except CliError as e:
            if e.status == 404:
                return False
            raise

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
            fn = lambda k=kind: k.list(self.custom, None if all_namespaces else self.ns, selector)
            for job in self.items(fn, kind.kind, namespace=None if all_namespaces else ""):  # a kind not served: none
                self._well_formed(job, f"list {kind.kind}")
                job.setdefault("kind", kind.kind)
                items.append(job)
        # the selector is applied again here: an API that ignores it must not make us list other tools' jobs
        return [j for j in items if _labels(j).get(C.LABEL_MANAGED_BY) == C.MANAGED_BY and _named(j)]

    def pods(self, job: dict[str, Any]) -> list[PodInfo]:
        """The job's pods (found by its kind's label), by node rank, each with why it is stuck or failing."""
        name, kind = job["metadata"]["name"], kind_of(job)
        selector = f"{kind.pod_selector}={name}"
        res = self.request(lambda: self.core.list_namespaced_pod(self.ns, label_selector=selector), "list", "Pod")
        out = []
        for pod in res.items:
            if (pod.metadata.labels or {}).get(kind.pod_selector) != name:
                continue
            replica, rank = kind.pod_rank(pod, job)
            statuses = (pod.status.container_statuses or []) if pod.status else []
            restarts = sum(cs.restart_count or 0 for cs in statuses)
            phase = (pod.status.phase if pod.status else None) or "Unknown"
            reason = None
            if phase != "Succeeded":  # the events are read only when the pod's own statuses do not say
                reason = status_reason(pod) or warning_reason(self.events(pod.metadata.name))
            out.append(PodInfo(pod.metadata.name, replica, rank, phase, restarts, reason))
        return sorted(out, key=lambda p: p.rank)

    def events(self, name: str) -> list:
        """The events of the object called ``name`` (a field selector: not every event of the namespace),
        oldest first; none when they cannot be read."""
        selector = f"involvedObject.name={name}"
        try:
            answer = self.request(
                lambda: self.core.list_namespaced_event(self.ns, field_selector=selector), "list", "Event"
            )
        except CliError:  # events are a nicety: no permission, no resource or a malformed answer must not break status
            return []
        items = [e for e in answer.items or [] if e.involved_object and e.involved_object.name == name]
        return sorted(items, key=lambda e: str(e.last_timestamp or e.event_time or ""))

    def pod(self, name: str) -> Any:
        """One pod, as the client's ``V1Pod``."""
        return self.request(lambda: self.core.read_namespaced_pod(name, self.ns), "get", "Pod", name)

    def log_lines(self, pod: str, kind: JobKind, follow: bool = False, **query: Any) -> Iterator[str]:
        """The trainer container's log (``kind.container``: the API server refuses another name).

        ``query``: the API's own log options (``tail_lines``, ``since_seconds``, ``previous``,
        ``timestamps``), passed as given."""
        options = {k: v for k, v in query.items() if v not in (None, False)}
        if not follow:
            text = self.request(
                lambda: self.core.read_namespaced_pod_log(pod, self.ns, container=kind.container, **options),
                "get logs of",
                "Pod",
                pod,
            )
            yield from (text or "").splitlines()
            return
        # a quiet log is not a stalled server (the poller checks that): a day's read timeout
        streaming = dict(follow=True, _preload_content=False, _request_timeout=(10, 24 * 3600))
        resp = self.request(
            lambda: self.core.read_namespaced_pod_log(pod, self.ns, container=kind.container, **streaming, **options),
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
