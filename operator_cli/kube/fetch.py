"""``colbert-k8s fetch NAME [--to DIR]``: a finished job's outputs, copied off its claim, without object storage.

How, as ``kubectl cp`` does it: a short-lived pod of this tool's own (:func:`pod_manifest`, labelled like every
object the tool creates, component ``fetch``, owned by the job) mounts the job's claim **read-only**, in the
job's own image and as the job's non-root user; a tar of the outputs is streamed out of it over the pod's
``exec`` subresource (binary websocket frames, :class:`ExecStream`) and extracted here. The pod is deleted on
every exit path; ``activeDeadlineSeconds`` ends it should this process be killed, and ``delete NAME`` removes
a leftover one (it carries the job's instance label).

What is fetched: only what the trainer writes whole (built under a temporary name, then renamed):
``final-model`` (with its card), ``metrics.json``, ``best-model`` and ``index``, those present. Checkpoints,
staged data and caches stay on the claim.

Refused in one line, before any pod is created:

* a job this tool did not create (as ``status`` and ``delete``);
* a job whose ``/workspace`` was each pod's emptyDir: there is no claim to read (use ``export:`` next time);
* a job not finished (Succeeded or Failed): its final model is not written yet, ``best-model`` and ``index``
  may be replaced mid-copy, and a ReadWriteOnce claim is still attached to its node;
* an ``output_dir`` outside ``/workspace``; an existing non-empty ``--to`` unless ``--overwrite``.

Extraction (:mod:`.archive`) trusts nothing in the archive: every member must be a plain file or directory
under one of the names asked for, with no absolute path and no ``..``; links of any kind (the trainer
writes none) and devices are refused, and every member is checked before any is placed. It is written into
a temporary sibling of ``--to`` and renamed into place only once whole: a failure leaves nothing written.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import operator_cli.kube.names as names
from operator_cli import constants as C
from operator_cli.errors import CliError
from operator_cli.kube.archive import ExecStream, check_destination, extract, staged
from operator_cli.kube.cluster import Cluster
from operator_cli.kube.kinds import find_all, job_state, kind_of, workspace_claim
from operator_cli.kube.pods import pod_reason
from operator_cli.render import render_one

__all__ = [
    "ITEMS",
    "FetchPod",
    "Fetched",
    "exec_stream",
    "fetch",
    "fetch_pod",
    "job_pod",
    "plan",
    "pod_manifest",
    "remove_pod",
    "source_dir",
    "wait_running",
]

ITEMS = ("final-model", "metrics.json", "best-model", "index")  # what the trainer writes whole
FINISHED = ("Succeeded", "Failed")
CONTAINER = "fetch"
START_SECONDS = 300  # for the pod to be scheduled, pull the image and mount the claim
IDLE_SECONDS = 120  # the longest silence from the pod's tar before the stream counts as stalled
POLL_SECONDS = 1.0

# Run in the pod by its own python (the job's image has one: it runs colbert-train); argv: the output dir,
# then the names. LIST says which are there and their size (for the progress bar); TAR streams them,
# links as links (never followed).
LIST = """import json, os, sys
root, found, size = sys.argv[1], [], 0
for name in sys.argv[2:]:
    path = os.path.join(root, name)
    if os.path.lexists(path):
        found.append(name)
        size += os.lstat(path).st_size if not os.path.isdir(path) else sum(
            os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(path) for f in files)
print(json.dumps({"exists": os.path.isdir(root), "items": found, "bytes": size}))
"""
TAR = """import os, sys, tarfile
with tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
    for name in sys.argv[2:]:
        tar.add(os.path.join(sys.argv[1], name), arcname=name)
"""


@dataclass(frozen=True)
class FetchPod:
    """What the fetch pod's template reads (``templates/fetchpod.yaml.j2``); ``name`` is the job's, for the
    instance label, as a JobSpec's is."""

    name: str
    namespace: str
    pod_name: str
    image: str
    claim: str
    deadline: int  # activeDeadlineSeconds
    source: str = ""  # fetch: the job's output_dir, inside the pod
    owner: dict[str, str] | None = None  # the job, for Kubernetes' garbage collector
    image_pull_secrets: list[str] = field(default_factory=list)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)  # the job's own --label values
    annotations: dict[str, str] = field(default_factory=dict)
    container: str = CONTAINER
    component: str = "fetch"  # its app.kubernetes.io/component label: fetch or upload
    read_only: bool = True  # the claim as fetch reads it; upload writes


@dataclass(frozen=True)
class Fetched:
    items: list[str]
    bytes: int
    to: Path


def source_dir(output_dir: str) -> str:
    """Where the job's ``output_dir`` lies in a pod: relative paths resolve in the working directory, /workspace.

    >>> source_dir("output"), source_dir("/workspace/runs/a/"), source_dir("./a/../b")
    ('/workspace/output', '/workspace/runs/a', '/workspace/b')
    >>> source_dir("/data/out")
    Traceback (most recent call last):
    ...
    operator_cli.errors.CliError: the job's output_dir /data/out is not on its claim (/workspace)
    """
    path = os.path.normpath(os.path.join(C.WORKSPACE_MOUNT, output_dir))
    if os.path.commonpath([path, C.WORKSPACE_MOUNT]) != C.WORKSPACE_MOUNT:
        raise CliError(
            f"the job's output_dir {output_dir} is not on its claim ({C.WORKSPACE_MOUNT})",
            hint="fetch copies from the claim mounted at /workspace; copy other paths with kubectl",
        )
    return path


# ---- what to fetch, from the live job ----------------------------------------------------------------------


def plan(cluster: Cluster, name: str, deadline: int, pod_name: str | None = None) -> FetchPod:
    """The fetch pod for job ``name``, or one line saying why there is nothing to fetch from."""
    job = cluster.get_own_job(name)
    return fetch_pod(job, lambda: _output_dir(cluster, name), cluster.ns, deadline, pod_name)


def fetch_pod(
    job: dict[str, Any], output_dir: Callable[[], str], namespace: str, deadline: int, pod_name: str | None = None
) -> FetchPod:
    """The fetch pod for a live job (pure; ``output_dir`` is read only once the job passes its checks)."""
    kind, name = kind_of(job), job["metadata"]["name"]
    what = f"{kind.kind} {namespace}/{name}"
    if (claim := workspace_claim(job)) is None:
        raise CliError(
            f"{what} has no claim: its /workspace was each pod's emptyDir, gone with the pods",
            hint="next time, keep the model with export: (object storage or the Hub) or a claim (--pvc/--pvc-size)",
        )
    if (state := job_state(job)) not in FINISHED:
        raise CliError(
            f"{what} is {state}: fetch copies a finished job's outputs (its final model is written at the end, "
            "and a ReadWriteOnce claim stays attached to its node)",
            hint=f"wait with `colbert-k8s status {name} -w`, then fetch",
            exit_code=1,
        )
    pod_name = pod_name or names.fetch_pod(name, secrets.token_hex(3))
    return job_pod(job, namespace, deadline, pod_name, claim=claim, source=source_dir(output_dir()))


def job_pod(job: dict[str, Any], namespace: str, deadline: int, pod_name: str, **fields: Any) -> FetchPod:
    """A short-lived pod of this tool's on a job's claim (fetch's, upload's): the job's image, pull secrets,
    tolerations and own labels, owned by the job (Kubernetes removes it with the job)."""
    kind, name, meta = kind_of(job), job["metadata"]["name"], job["metadata"]
    spec = job.get("spec", {})
    pod_images = (c.get("image") for cs in find_all(spec, "containers") for c in cs if c.get("image"))
    image = kind.image(job) or next(pod_images, None)
    if not image:
        raise CliError(
            f"{kind.kind} {namespace}/{name} names no image to reach its claim with", hint="use kubectl cp instead"
        )
    labels = {
        k: v
        for k, v in (meta.get("labels") or {}).items()
        if not k.startswith("app.kubernetes.io/") and k != C.LABEL_KUEUE_QUEUE
    }
    owner = {"apiVersion": kind.api_version, "kind": kind.kind, "name": name, "uid": meta.get("uid")}
    return FetchPod(
        name=name,
        namespace=namespace,
        pod_name=pod_name,
        image=image,
        deadline=deadline,
        owner=owner if meta.get("uid") else None,
        image_pull_secrets=sorted({s["name"] for found in find_all(spec, "imagePullSecrets") for s in found}),
        tolerations=next(iter(find_all(spec, "tolerations")), []),
        labels=labels,
        **fields,
    )


def _output_dir(cluster: Cluster, name: str) -> str:
    """The job's ``output_dir``, from the config in its ConfigMap (what its pods ran with)."""
    from operator_cli.spec import parse_training_config  # the trainer's schema: pydantic, read when fetch runs

    cm, text = names.config_map(name), cluster.config_text(name)
    if text is None:
        raise CliError(
            f"ConfigMap {cluster.ns}/{cm} (the job's config) is missing or holds no {C.CONFIG_FILE}: "
            "cannot tell where the job wrote its outputs",
            hint="fetch it with kubectl cp instead",
        )
    try:
        return parse_training_config(text).output_dir
    except Exception as e:  # ConfigError, or a config of another version: one line either way
        raise CliError(f"ConfigMap {cluster.ns}/{cm} holds a config this version cannot read ({e})") from None


def pod_manifest(pod: FetchPod) -> dict[str, Any]:
    """The fetch pod (pure: ``fetch`` creates exactly this)."""
    return render_one("fetchpod.yaml.j2", pod)


# ---- the exec stream ---------------------------------------------------------------------------------------


def exec_stream(
    cluster: Cluster, pod: str, command: list[str], progress=None, *, stdin: bool = False, container: str = CONTAINER
) -> ExecStream:
    """``command`` run in the fetch (or upload) pod over the exec subresource, binary-safe; ``stdin``: the
    stream also writes (:meth:`ExecStream.write`)."""
    from kubernetes.stream import stream

    from operator_cli.kube.transport import refuse_ws_redirects

    refuse_ws_redirects()  # the token goes to the API server only, never through a redirect
    what = f"{command[0]} in Pod {cluster.ns}/{pod}"
    try:
        ws = cluster.request(
            lambda: stream(
                cluster.core.connect_get_namespaced_pod_exec,
                pod,
                cluster.ns,
                command=command,
                container=container,
                stdin=stdin,
                stdout=True,
                stderr=True,
                tty=False,
                _preload_content=False,
                binary=True,
            ),
            "exec in",
            "Pod",
            pod,
        )
    except CliError as e:
        if e.status != 0 or not (refused := re.search(r"Handshake status (\d+) ([\w ]+)", e.message)):
            raise
        status = int(refused[1])  # the websocket handshake's refusal arrives as text, with its headers: not shown
        hint = (
            "fetch and upload need RBAC permission to create pods/exec; check with "
            f"`kubectl auth can-i create pods --subresource=exec -n {cluster.ns}`"
            if status == 403
            else "the pod may have been removed or evicted; run the command again"
        )
        raise CliError(
            f"cannot exec in Pod {cluster.ns}/{pod}: {status} {refused[2].strip()}", hint=hint, status=status
        ) from e
    ws.sock.settimeout(IDLE_SECONDS)
    return ExecStream(ws.sock, what, progress)


# ---- the whole fetch ---------------------------------------------------------------------------------------


def fetch(
    cluster: Cluster,
    name: str,
    to: Path,
    *,
    overwrite: bool = False,
    deadline: int = 3600,
    pod_name: str | None = None,
    progress: Callable[[int], contextlib.AbstractContextManager] | None = None,
    warn: Callable[[str], Any] = print,
    open_exec: Callable[..., ExecStream] | None = None,
) -> Fetched:
    """Copy job ``name``'s whole outputs into ``to``; the fetch pod is gone again on every exit path.

    ``progress(total_bytes)`` is a context manager giving ``update(n)`` (``click.progressbar``);
    ``open_exec`` runs a command in the pod (:func:`exec_stream`; tests pass a stand-in)."""
    check_destination(to, overwrite)
    open_exec = open_exec or exec_stream
    pod = plan(cluster, name, deadline, pod_name)
    cluster.create(pod_manifest(pod))
    try:
        wait_running(cluster, pod.pod_name, min(START_SECONDS, deadline))
        listing = _listing(cluster, pod, open_exec)
        items = listing["items"]
        what = f"the tar of {name}'s outputs from Pod {cluster.ns}/{pod.pod_name}"
        bar = progress(int(listing["bytes"])) if progress else contextlib.nullcontext(None)
        with staged(to, overwrite) as tmp, bar as shown:
            stream = open_exec(
                cluster,
                pod.pod_name,
                ["python", "-c", TAR, pod.source, *items],
                shown.update if shown is not None else None,
            )
            try:
                extract(stream, tmp, set(items), what)
                stream.finish()
            finally:
                stream.close()
    finally:
        remove_pod(cluster, pod.pod_name, name, warn)
    return Fetched(items, int(listing["bytes"]), to)


def _listing(cluster: Cluster, pod: FetchPod, open_exec) -> dict[str, Any]:
    """Which of :data:`ITEMS` the output directory holds, and their size; none is one line."""
    stream = open_exec(cluster, pod.pod_name, ["python", "-c", LIST, pod.source, *ITEMS])
    try:
        out = stream.read()
        stream.finish()
    finally:
        stream.close()
    try:
        listing = json.loads(out)
        assert isinstance(listing["items"], list) and isinstance(listing["bytes"], int)
    except (ValueError, KeyError, TypeError, AssertionError):
        raise CliError(
            f"Pod {cluster.ns}/{pod.pod_name} answered the listing of {pod.source} with something else than its JSON",
            hint="check that the job's image runs python",
        ) from None
    if not listing["items"]:
        there = "holds none of " + ", ".join(ITEMS) if listing.get("exists") else "does not exist"
        raise CliError(
            f"nothing to fetch: job {pod.name}'s output_dir {pod.source} on claim {pod.claim} {there}",
            hint=f"see `colbert-k8s logs {pod.name}`: a job that failed before its end writes no final model",
            exit_code=1,
        )
    return listing


def wait_running(cluster: Cluster, pod: str, seconds: float) -> None:
    """Until the pod runs (scheduled, image pulled, claim mounted); why not, in one line, after ``seconds``."""
    give_up = time.monotonic() + seconds
    while True:
        obj = cluster.pod(pod)
        phase = (obj.status.phase if obj.status else None) or "Pending"
        running = [cs for cs in (obj.status.container_statuses or []) if cs.state and cs.state.running]
        if phase == "Running" and running:
            return
        if phase in ("Succeeded", "Failed") or time.monotonic() > give_up:
            why = pod_reason(obj, cluster.events(pod)) or obj.status and obj.status.reason or "no reason reported"
            raise CliError(
                f"Pod {cluster.ns}/{pod} is {phase} after {seconds:g}s: {why}",
                hint="a claim another pod still uses on another node cannot be mounted (ReadWriteOnce); "
                f"see `kubectl describe pod {pod} -n {cluster.ns}`",
            )
        time.sleep(POLL_SECONDS)


def remove_pod(cluster: Cluster, pod: str, job: str, warn: Callable[[str], Any]) -> None:
    """Delete this tool's short-lived pod; a failure is a warning (its deadline ends it anyway)."""
    try:
        cluster.delete("Pod", pod)
    except CliError as e:  # never hides the fetch's own outcome; the pod's deadline ends it anyway
        warn(
            f"warning: could not delete Pod {cluster.ns}/{pod} ({e.message}); it stops at its deadline, "
            f"and `colbert-k8s delete {job}` removes it"
        )
