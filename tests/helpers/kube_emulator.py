"""An in-process Kubernetes API (kmock's emulator) over real HTTP, with a kubeconfig pointing at it.

What a real API server does that kmock alone does not, and how this file closes the gap:

* create answers 201 with the stored object, and the object gains ``metadata.uid``,
  ``resourceVersion``, ``creationTimestamp`` and ``namespace``: :class:`_ApiServer` sets them, so
  the ownerReference PATCH that follows a job's create runs under test;
* every update bumps ``resourceVersion``; PUT replaces an object whole (kmock serves no PUT);
* a pod's log is refused (400) for a container the pod does not have;
* cluster-scoped reads (namespaces, ClusterTrainingRuntimes) are routed by hand below;
* deleting an object deletes the objects it owns (ownerReferences), as the garbage collector does
  (unless ``propagationPolicy: Orphan``);
* a create with ``?dryRun=All`` is answered with the object as it would be stored, and not stored;

Not emulated: admission webhooks, CRD schema validation (the tests validate manifests against the
Kubeflow SDK models instead), finalizers' waits, and the controllers.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import threading
import uuid
from pathlib import Path
from typing import Any

import kmock
import yaml

PODS = kmock.resource("", "v1", "pods")


class _ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator plus the fields an API server sets on every object it stores."""

    _versions = itertools.count(1000)

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.dry_runs: list = []  # creates sent with ?dryRun=All: answered, never stored

    async def _handle(self, request):
        if request.resource is not None and request.resource.plural == "selfsubjectaccessreviews":
            return await super(kmock.KubernetesEmulator, self)._handle(request)  # a question, never stored
        if request.subresource == "log" and request.name:  # the API server checks the container name
            refusal = self._bad_container(request)
            if refusal is not None:
                return await self._render_error(refusal)
        data = request.data if request.resource is not None and isinstance(request.data, dict) else None
        if data is not None and request.action in (kmock.action.CREATE, kmock.action.UPDATE):
            meta = data.setdefault("metadata", {})
            meta["resourceVersion"] = str(next(self._versions))
            if request.action == kmock.action.CREATE:
                meta["uid"] = str(uuid.uuid4())
                meta["creationTimestamp"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                if request.namespace:
                    meta.setdefault("namespace", request.namespace)
        if data is not None and request.action == kmock.action.CREATE and request.params.get("dryRun") == "All":
            import aiohttp.web

            # answered as it would be stored, and not stored (a real server also runs its admission webhooks
            # and defaulting, which this one has none of)
            self.dry_runs.append(request)
            return aiohttp.web.json_response(data, status=201)
        if request.resource is not None and request.name and str(request.method).endswith("PUT"):
            return await self._replace(request)
        owner_uid = self._uid_of(request) if request.action == kmock.action.DELETE and request.name else None
        response = await super()._handle(request)
        if owner_uid and request.params.get("propagationPolicy") != "Orphan":
            self._collect(owner_uid)
        return response

    async def _replace(self, request):
        """PUT (kmock serves none): the stored object is replaced whole, if the resourceVersion sent is the
        stored one (409 otherwise, as an API server's optimistic concurrency)."""
        import aiohttp.web
        from kmock._internal.k8s import KubernetesError

        key = (request.resource, request.namespace, request.name)
        found = self.objects[key] if key in self.objects else None
        if found is None or found.deleted:
            return await self._render_error(KubernetesError(404, "NotFound", f"{request.name} not found"))
        sent, stored = request.data.get("metadata", {}), found.raw.get("metadata", {})
        if sent.get("resourceVersion") not in (None, stored.get("resourceVersion")):
            return await self._render_error(KubernetesError(409, "Conflict", "the object has been modified"))
        body = {
            **request.data,
            "metadata": {**sent, "uid": stored.get("uid"), "resourceVersion": str(next(self._versions))},
        }
        self.objects[key] = body
        return aiohttp.web.json_response(body)

    def _uid_of(self, request) -> str | None:
        for (res, ns, name), obj in self.objects.items():
            if res == request.resource and ns == request.namespace and name == request.name and not obj.deleted:
                return (obj.raw.get("metadata") or {}).get("uid")
        return None

    def _collect(self, owner_uid: str) -> None:
        """The garbage collector: objects owned by a deleted object go with it (Background and Foreground)."""
        for _, obj in list(self.objects.items()):
            if obj.deleted:  # a soft-deleted object has no raw form
                continue
            refs = (obj.raw.get("metadata") or {}).get("ownerReferences") or []
            if any(r.get("uid") == owner_uid for r in refs):
                obj.delete()

    def _bad_container(self, request):
        from kmock._internal.k8s import KubernetesError

        wanted = request.params.get("container")
        for (res, ns, name), obj in self.objects.items():
            if res.plural == "pods" and ns == request.namespace and name == request.name and not obj.deleted:
                names = [c.get("name") for c in obj.raw.get("spec", {}).get("containers", [])]
                if wanted is not None and wanted not in names:
                    return KubernetesError(400, "BadRequest", f"container {wanted} is not valid for pod {name}")
        return None


class Emulator:
    """Runs ``kmock.KubernetesEmulator`` on a background event loop; tests add objects and reactions."""

    def __init__(
        self,
        tmp: Path,
        with_crd: bool = True,
        namespaces: tuple[str, ...] = ("default", "ml"),
        with_v2: bool = False,
        runtimes: tuple[dict, ...] = (),
        nodes: tuple[dict, ...] = (),
        storage_classes: tuple[dict, ...] = (),
        denied: tuple[str, ...] = (),
        with_kueue: bool = False,
        with_sweeps: bool = False,
    ):
        """``with_crd``: serve PyTorchJobs (Training Operator v1); ``with_v2``: serve TrainJobs (Trainer v2),
        with ``runtimes`` as its ClusterTrainingRuntimes (get by name; kmock routes no cluster-scoped reads)."""
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.with_crd = with_crd
        self.with_v2 = with_v2
        self.runtimes = runtimes
        self.nodes, self.storage_classes, self.denied, self.with_kueue = nodes, storage_classes, denied, with_kueue
        self.with_sweeps = with_sweeps  # Katib's Experiments and Trials, Trainer's OptimizationJobs (tune)
        self.namespaces = namespaces
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.thread.start()
        assert self._ready.wait(15), "the emulator did not start"
        self.kubeconfig = tmp / "kubeconfig"
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "kmock",
                    "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
                    "users": [{"name": "tester", "user": {"token": "not-a-real-token"}}],
                    "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "tester"}}],
                }
            )
        )

    async def _main(self) -> None:
        async with _ApiServer() as emu, kmock.Server(emu) as srv:
            self.emu, self.url, self.loop = emu, str(srv.url).rstrip("/"), asyncio.get_running_loop()
            if self.with_crd:
                emu.resources["kubeflow.org/v1/pytorchjobs"] = kmock.ResourceInfo(kind="PyTorchJob", namespaced=True)
            if self.with_v2:
                emu.resources["trainer.kubeflow.org/v1alpha1/trainjobs"] = kmock.ResourceInfo(
                    kind="TrainJob", namespaced=True
                )
                for rt in self.runtimes:
                    path = f"/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes/{rt['metadata']['name']}"
                    emu[f"get {path}"] << rt
            # the cluster-scoped reads `doctor` makes, routed by hand like the namespaces below
            served = [("pytorchjobs.kubeflow.org", "v1")] * self.with_crd
            served += [("trainjobs.trainer.kubeflow.org", "v1alpha1")] * self.with_v2
            for crd, version in served:
                plural, group = crd.split(".", 1)
                kind = {"pytorchjobs": "PyTorchJob", "trainjobs": "TrainJob"}[plural]
                emu[f"get /apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}"] << {
                    "apiVersion": "apiextensions.k8s.io/v1",
                    "kind": "CustomResourceDefinition",
                    "metadata": {"name": crd, "uid": str(uuid.uuid4()), "resourceVersion": "1"},
                    "spec": {
                        "group": group,
                        "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
                        "scope": "Namespaced",
                        "versions": [
                            {
                                "name": version,
                                "served": True,
                                "storage": True,
                                "schema": {
                                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                                },
                            }
                        ],
                    },
                    "status": {"storedVersions": [version]},
                }
            emu["get /api/v1/nodes"] << {"apiVersion": "v1", "kind": "NodeList", "items": list(self.nodes)}
            emu["get /apis/storage.k8s.io/v1/storageclasses"] << {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClassList",
                "items": list(self.storage_classes),
            }
            denied = self.denied

            def review(req) -> dict:  # SelfSubjectAccessReview: allowed unless the test denies the resource
                attrs = req.data["spec"]["resourceAttributes"]
                allowed = attrs["resource"] not in denied
                return {**req.data, "status": {"allowed": allowed, **({} if allowed else {"reason": "RBAC: denied"})}}

            emu["post /apis/authorization.k8s.io/v1/selfsubjectaccessreviews"] << 201 << review
            if self.with_sweeps:
                for res, kind in (
                    ("kubeflow.org/v1beta1/experiments", "Experiment"),
                    ("kubeflow.org/v1beta1/trials", "Trial"),
                    ("trainer.kubeflow.org/v1alpha1/optimizationjobs", "OptimizationJob"),
                ):
                    emu.resources[res] = kmock.ResourceInfo(kind=kind, namespaced=True)
            if self.with_kueue:
                emu.resources["kueue.x-k8s.io/v1beta1/localqueues"] = kmock.ResourceInfo(
                    kind="LocalQueue", namespaced=True
                )
            for res, kind, sub in (
                ("apps/v1/deployments", "Deployment", set()),
                ("v1/resourcequotas", "ResourceQuota", set()),
                ("v1/configmaps", "ConfigMap", set()),
                ("v1/pods", "Pod", {"log"}),
                ("v1/secrets", "Secret", set()),
                ("v1/events", "Event", set()),
                ("v1/persistentvolumeclaims", "PersistentVolumeClaim", set()),
            ):
                emu.resources[res] = kmock.ResourceInfo(kind=kind, namespaced=True, subresources=sub)
            # a real API server answers create with 201 and the stored object (kmock's default is 200)
            (emu**-1)[kmock.action.CREATE] << 201 << (lambda req: req.data)
            for ns in self.namespaces:  # kmock cannot route cluster-scoped namespace reads by itself
                emu[f"get /api/v1/namespaces/{ns}"] << {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": ns},
                }
            self._stop = asyncio.Event()
            self._ready.set()
            await self._stop.wait()

    def add(self, resource: str, namespace: str, obj: dict[str, Any]) -> None:
        group_version, plural = resource.rsplit("/", 1)
        group, _, version = group_version.rpartition("/")
        key = (kmock.resource(group, version, plural), namespace, obj["metadata"]["name"])

        async def store() -> None:  # on the emulator's own loop: safe while a request is in flight
            self.emu.objects[key] = obj

        asyncio.run_coroutine_threadsafe(store(), self.loop).result(timeout=10)

    def objects(self, plural: str) -> list[dict]:
        return [obj.raw for (res, _, _), obj in self.emu.objects.items() if res.plural == plural and not obj.deleted]

    def react(self, *criteria) -> Any:
        return self.emu[criteria]

    def __enter__(self) -> Emulator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(timeout=10)
