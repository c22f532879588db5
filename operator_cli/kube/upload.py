"""``colbert-k8s upload (NAME | --pvc CLAIM) LOCAL_PATH [DEST]``: local data onto a job's claim, as
``kubectl cp`` would, so a config's relative ``data/...`` path finds it under ``/workspace``.

The pod is ``fetch``'s (:mod:`.fetch`: the same template, labels, security context, deadline and removal),
with the claim mounted read-write and component ``upload``: for ``NAME``, the job's image, pull secrets and
tolerations, owned by the job; for ``--pvc``, ``--image`` (the trainer's by default: it has python) and no
owner. A tar of ``LOCAL_PATH`` (links followed: the job reads their content) is streamed into it over the
``exec`` subresource's stdin (:meth:`ExecStream.write`), and :data:`UNTAR`, run by the pod's python, places
it: every member checked (a file or directory under the one top-level name, no absolute path, no ``..``),
written into a temporary sibling of ``DEST`` and renamed into place once whole: the stream is framed and ends
with the SHA-256 of the tar, so a stream cut anywhere (a dropped connection) leaves ``DEST`` as it was. An
existing ``DEST`` is refused unless ``--overwrite``, which replaces it only then. A local file that cannot be
read (a dangling link) is one line naming it.

Refused in one line, before any pod: a job without a claim (each pod's emptyDir), a job whose pods run (a
ReadWriteOnce claim is attached to their node, and the trainer may be reading: ``submit --suspend``, upload,
``resume``), a ``--pvc`` that does not exist, a ``DEST`` outside ``/workspace``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import operator_cli.kube.names as names
from operator_cli import constants as C
from operator_cli.errors import CliError
from operator_cli.kube import fetch
from operator_cli.kube.archive import ExecStream, send_tree, tree_bytes
from operator_cli.kube.cluster import Cluster
from operator_cli.kube.kinds import job_state, kind_of, workspace_claim

__all__ = ["CONTAINER", "UNTAR", "claim_path", "default_dest", "pod_for_claim", "pod_for_job", "upload"]

CONTAINER = "upload"
ARCNAME = "data"  # the archive's one top-level member, renamed to DEST in the pod

# Run in the pod by its python; argv: DEST, the temporary directory beside it, 1 to replace an existing DEST.
# stdin is the tar in frames (:class:`_Framed`): DEST is replaced only once the end frame has come and the
# digest of every byte before it matches, so a cut stream (which tarfile's stream mode may take for the end of
# the archive, at or inside a member's header) leaves DEST as it was.
UNTAR = """import hashlib, os, shutil, sys, tarfile
dest, tmp, overwrite = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if os.path.lexists(dest) and not overwrite:
    sys.exit(f"{dest} already exists on the claim")


class Cut(Exception):
    pass


class Frames:
    def __init__(self, raw):
        self.raw, self.left, self.sha, self.whole = raw, 0, hashlib.sha256(), False

    def exact(self, n):
        out = bytearray()
        while len(out) < n:
            got = self.raw.read(n - len(out))
            if not got:
                raise Cut("the upload stream was cut short")
            out += got
        return bytes(out)

    def read(self, n=-1):
        while not self.left and not self.whole:
            self.left = int.from_bytes(self.exact(8), "big")
            if not self.left:
                if self.exact(32) != self.sha.digest():
                    raise Cut("the upload stream arrived damaged (its SHA-256 differs)")
                self.whole = True
        if self.whole:
            return b""
        data = self.exact(self.left if n < 0 else min(n, self.left))
        self.left -= len(data)
        self.sha.update(data)
        return data


src = Frames(sys.stdin.buffer)
os.makedirs(tmp)
try:
    with tarfile.open(fileobj=src, mode="r|") as tar:
        for m in tar:
            parts = m.name.split("/")
            if m.name.startswith("/") or ".." in parts or parts[0] != "data" or not (m.isreg() or m.isdir()):
                sys.exit(f"refused the member {m.name[:120]!r}: files and directories under data/ only")
            target = os.path.join(tmp, *parts)
            if m.isdir():
                os.makedirs(target, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with tar.extractfile(m) as f, open(target, "xb") as out:
                shutil.copyfileobj(f, out, 1 << 20)
    while src.read(1 << 20):
        pass  # the tar's padding, up to the end frame and its digest
    if not os.path.lexists(os.path.join(tmp, "data")):
        raise Cut("the upload stream held no data/")
    old = tmp + ".old"
    if os.path.lexists(dest):
        os.replace(dest, old)
    os.replace(os.path.join(tmp, "data"), dest)
    shutil.rmtree(old) if os.path.isdir(old) and not os.path.islink(old) else os.path.lexists(old) and os.unlink(old)
except Cut as e:
    sys.exit(f"{e}; {dest} is left as it was")
except tarfile.TarError as e:
    sys.exit(f"the upload stream is not a whole tar ({e}); {dest} is left as it was")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
"""


def default_dest(local: str) -> str:
    """Where LOCAL_PATH lands without DEST: the same relative path (the config's ``data/train.jsonl`` is then
    found), else its last component.

    >>> default_dest("data/train.jsonl"), default_dest("./data/beir/"), default_dest("/tmp/x/corpus.jsonl")
    ('data/train.jsonl', 'data/beir', 'corpus.jsonl')
    """
    norm = os.path.normpath(local)
    if os.path.isabs(norm) or norm.split(os.sep)[0] == "..":
        return os.path.basename(norm)
    return norm


def claim_path(dest: str) -> str:
    """DEST inside the pod: relative paths resolve under /workspace, which it must not leave nor be.

    >>> claim_path("data/train.jsonl"), claim_path("/workspace/a/b")
    ('/workspace/data/train.jsonl', '/workspace/a/b')
    >>> claim_path("../etc")
    Traceback (most recent call last):
    ...
    operator_cli.errors.CliError: DEST ../etc is not under the claim's mount (/workspace)
    """
    path = os.path.normpath(os.path.join(C.WORKSPACE_MOUNT, dest))
    if os.path.commonpath([path, C.WORKSPACE_MOUNT]) != C.WORKSPACE_MOUNT or path == C.WORKSPACE_MOUNT:
        raise CliError(
            f"DEST {dest} is not under the claim's mount ({C.WORKSPACE_MOUNT})",
            hint="give a path relative to /workspace, as the config names it (e.g. data/train.jsonl)",
        )
    return path


def pod_for_job(job: dict[str, Any], namespace: str, deadline: int) -> fetch.FetchPod:
    """The upload pod on a job's claim, or one line saying why not (pure)."""
    kind, name = kind_of(job), job["metadata"]["name"]
    what = f"{kind.kind} {namespace}/{name}"
    if (claim := workspace_claim(job)) is None:
        raise CliError(
            f"{what} has no claim: its /workspace is each pod's emptyDir, which nothing can fill beforehand",
            hint="submit with --pvc-size (or --pvc) and --suspend, upload, then resume; or use an s3:// or "
            "https:// source in the config",
        )
    state = job_state(job)
    if not kind.suspended(job) and state not in fetch.FINISHED:
        raise CliError(
            f"{what} is {state}: its pods may be reading the claim (and a ReadWriteOnce claim is attached to "
            "their node)",
            hint=f"`colbert-k8s suspend {name}`, upload, then `colbert-k8s resume {name}` (next time: submit "
            "--suspend)",
            exit_code=1,
        )
    pod_name = names.fetch_pod(name, secrets.token_hex(3), CONTAINER)
    fields = {"claim": claim, "container": CONTAINER, "component": CONTAINER, "read_only": False}
    return fetch.job_pod(job, namespace, deadline, pod_name, **fields)


def pod_for_claim(cluster: Cluster, claim: str, image: str, deadline: int, pull_secrets: list[str]) -> fetch.FetchPod:
    """The upload pod on an existing claim (no job owns it: its deadline and this command remove it)."""
    if cluster.object("PersistentVolumeClaim", claim) is None:
        raise CliError(
            f"PersistentVolumeClaim {cluster.ns}/{claim} does not exist",
            hint="create it first (kubectl), or submit with --pvc-size and --suspend, then upload NAME",
        )
    return fetch.FetchPod(
        name=claim,
        namespace=cluster.ns,
        pod_name=names.fetch_pod(claim, secrets.token_hex(3), CONTAINER),
        image=image,
        claim=claim,
        deadline=deadline,
        image_pull_secrets=pull_secrets,
        container=CONTAINER,
        component=CONTAINER,
        read_only=False,
    )


def upload(
    cluster: Cluster,
    pod: fetch.FetchPod,
    local: Path,
    dest: str,
    *,
    overwrite: bool = False,
    progress: Callable[[int], contextlib.AbstractContextManager] | None = None,
    warn: Callable[[str], Any] = print,
    open_exec: Callable[..., ExecStream] | None = None,
) -> int:
    """Stream ``local`` into ``dest`` (a path under /workspace) through ``pod``; returns the bytes sent. The pod
    is gone again on every exit path. ``open_exec``: :func:`fetch.exec_stream` (tests pass a stand-in)."""
    if not local.exists():
        raise CliError(f"LOCAL_PATH {local} does not exist", hint="give a file or a directory on this machine")
    open_exec = open_exec or fetch.exec_stream
    target = claim_path(dest)
    tmp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.upload-{secrets.token_hex(4)}")
    total = tree_bytes(local)
    cluster.create(fetch.pod_manifest(pod))
    try:
        fetch.wait_running(cluster, pod.pod_name, min(fetch.START_SECONDS, pod.deadline))
        bar = progress(total) if progress else contextlib.nullcontext(None)
        with bar as shown:
            command = ["python", "-c", UNTAR, target, tmp, "1" if overwrite else "0"]
            update = shown.update if shown is not None else None
            stream = open_exec(cluster, pod.pod_name, command, update, stdin=True, container=CONTAINER)
            try:
                _send(local, stream)
            finally:
                stream.close()
    finally:
        fetch.remove_pod(cluster, pod.pod_name, pod.name, warn)
    return total


class _PodStopped(Exception):
    """The pod's stdin took no more bytes: it exited (DEST exists, a member refused), or the exec broke."""


class _Framed:
    """The pod's stdin as :data:`UNTAR` reads it: each write a frame (its length in 8 bytes, then the bytes),
    and at the end a zero length and the SHA-256 of every byte before it. The pod tells a whole stream from a
    cut one by that end frame, which no cut stream carries."""

    def __init__(self, stream: ExecStream):
        self.stream, self.sha = stream, hashlib.sha256()

    def write(self, data: bytes) -> int:
        if data:
            self.sha.update(data)
            self._send(len(data).to_bytes(8, "big") + data)
        return len(data)

    def end(self) -> None:
        self._send(bytes(8) + self.sha.digest())
        self.stream.close_stdin()

    def _send(self, data: bytes) -> None:
        from websocket import WebSocketException

        try:
            self.stream.write(data)
        except (OSError, WebSocketException) as e:
            raise _PodStopped from e


def _send(local: Path, stream: ExecStream) -> None:
    """The tar into the pod, then its exit status; a pod that stopped reading (DEST exists) says why. A file
    of ``local`` that cannot be read is one line naming it, at once: the stream is then cut, and the pod
    leaves DEST as it was."""
    framed = _Framed(stream)
    try:
        send_tree(local, framed, ARCNAME)
        framed.end()
    except _PodStopped:
        pass  # the pod stopped reading: its status says why
    except OSError as e:  # only the local tree's reads: the stream's own errors are _PodStopped
        raise CliError(
            f"cannot read {e.filename or local}: {e.strerror or e}; nothing on the claim was replaced",
            hint="fix or remove it (a link must point at a file or directory that exists), then upload again",
        ) from None
    try:
        stream.finish()
    except CliError as e:
        if "already exists on the claim" in e.message:
            e.hint = "pass another DEST, or --overwrite to replace it once the new copy is whole"
        raise
