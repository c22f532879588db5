"""``colbert-k8s fetch``: the pod it creates, the archive it refuses, the exec stream it reads, and the whole
command against the in-process API (kmock).

kmock cannot serve ``exec`` (a websocket upgrade of ``pods/NAME/exec``). The exec part is driven one level
down, at websocket-client's ``recv_data_frame``: :class:`FrameSocket` hands out the frames a kubelet sends
(one channel byte, then the bytes; the status on channel 3; a close), and :func:`local_exec` runs the very
LIST and TAR scripts the pod would run, on a local directory standing for the claim. What stays untested
here: the websocket handshake and the client's URL for exec, the kubelet's framing, and a real pod's
mount of a real claim.
"""

from __future__ import annotations

import doctest
import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import pytest
import yaml
from click.testing import CliRunner
from websocket import ABNF, WebSocketConnectionClosedException, WebSocketTimeoutException

from operator_cli import __version__
from operator_cli.cli import cli
from operator_cli.errors import CliError
from operator_cli.kube import fetch as F
from operator_cli.kube.archive import WRITE_FRAME, ExecStream, extract, staged
from operator_cli.render import render
from operator_cli.spec import JobSpec
from tests.helpers.kube_emulator import PODS, Emulator
from tests.helpers.schemas import validate_core

CONFIG = "data:\n  train: {path: data/train.jsonl}\ntraining: {per_device_batch_size: 32}\noutput_dir: runs/demo\n"
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _job(api: str = "pytorchjob", state: str = "Succeeded", uid: str | None = "uid-1", **opts) -> list[dict]:
    """The objects ``submit`` creates for job demo, the job as the API server shows it once ``state``."""
    opts = {"pvc": "data", **opts}
    spec = JobSpec(
        name="demo",
        config_text=CONFIG,
        api=api,
        image="reg.example/colbert-train:1",
        image_pull_secrets=["regcred"],
        labels={"team": "ir"},
        queue="q",
        tolerations=[TOLERATION],
        **opts,
    )
    objects = render(spec)
    job = objects[-1]
    job["metadata"].update({"uid": uid} if uid else {})
    condition = "Complete" if api == "trainjob" and state == "Succeeded" else state
    job["status"] = {"conditions": [{"type": condition, "status": "True"}]}
    return objects


def _pod_template_spec(job: dict) -> dict:
    if job["kind"] == "TrainJob":
        patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        return patch["template"]["spec"]["template"]["spec"]
    return job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]


# ---- the pod ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_fetch_pod_is_valid_read_only_non_root_and_labelled(api):
    job = _job(api)[-1]
    pod = F.fetch_pod(job, lambda: "runs/demo", "default", 900, pod_name="demo-fetch-abc")
    manifest = F.pod_manifest(pod)
    validate_core(manifest)  # kubernetes-validate, strict: no unknown field, every type right
    spec, (container,) = manifest["spec"], manifest["spec"]["containers"]
    assert manifest["metadata"]["labels"] == {
        "app.kubernetes.io/name": "colbert-k8s",
        "app.kubernetes.io/instance": "demo",
        "app.kubernetes.io/managed-by": "colbert-k8s",
        "app.kubernetes.io/component": "fetch",
        "app.kubernetes.io/version": __version__,
        "team": "ir",  # the job's own --label; not its Kueue queue, which would gate the pod
    }
    assert spec["volumes"] == [{"name": "workspace", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}}]
    assert container["volumeMounts"] == [{"name": "workspace", "mountPath": "/workspace", "readOnly": True}]
    assert spec["securityContext"] == _pod_template_spec(job)["securityContext"]  # one source: _pod.j2
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 1000
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False and security["capabilities"] == {"drop": ["ALL"]}
    assert security["readOnlyRootFilesystem"] is True and security["runAsNonRoot"] is True
    assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] == 900
    assert spec["automountServiceAccountToken"] is False
    assert container["image"] == "reg.example/colbert-train:1" and container["command"][-1] == "900"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}] and spec["tolerations"] == [TOLERATION]
    assert "nvidia.com/gpu" not in json.dumps(container.get("resources"))
    kind = job["apiVersion"], job["kind"]
    assert manifest["metadata"]["ownerReferences"] == [
        {"apiVersion": kind[0], "kind": kind[1], "name": "demo", "uid": "uid-1", "blockOwnerDeletion": False}
    ]
    assert pod.source == "/workspace/runs/demo"


def test_fetch_pod_refuses_a_job_without_a_claim_and_a_running_job():
    with pytest.raises(CliError) as e:
        F.fetch_pod(_job(pvc=None, pod_local_storage=True)[-1], lambda: "out", "default", 900)
    assert "has no claim" in e.value.message and "export:" in e.value.hint and e.value.exit_code == 2
    with pytest.raises(CliError) as e:
        F.fetch_pod(_job(state="Running")[-1], lambda: "out", "default", 900)
    assert "is Running" in e.value.message and e.value.exit_code == 1


def test_doctests():
    result = doctest.testmod(F)
    assert result.attempted > 0 and result.failed == 0


# ---- the archive --------------------------------------------------------------------------------------------


def _member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", link: str = "") -> tuple:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, len(data)
    return info, data


def _tar(*members: tuple) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buf.getvalue()


GOOD = _member("metrics.json", data=b'{"ndcg@10": 0.5}\n')  # first, then the hostile member
HOSTILE = [
    ("absolute path", _member("/tmp/evil", data=b"x"), "an absolute path"),
    ("dotdot", _member("final-model/../../evil", data=b"x"), "'..'"),
    ("symlink escape", _member("final-model/up", tarfile.SYMTYPE, link="../../.."), "a link"),
    ("absolute symlink", _member("final-model/passwd", tarfile.SYMTYPE, link="/etc/passwd"), "a link"),
    ("in-tree symlink", _member("final-model/latest", tarfile.SYMTYPE, link="model.safetensors"), "a link"),
    ("hard link escape", _member("final-model/h", tarfile.LNKTYPE, link="../../../etc/passwd"), "a link"),
    ("in-tree hard link", _member("final-model/h", tarfile.LNKTYPE, link="metrics.json"), "a link"),
    ("char device", _member("final-model/null", tarfile.CHRTYPE), "a device or pipe"),
    ("fifo", _member("final-model/pipe", tarfile.FIFOTYPE), "a device or pipe"),
    ("outside the names", _member("secrets.txt", data=b"x"), "a path outside final-model, metrics.json"),
    ("given twice", _member("metrics.json", data=b"{}"), "a name given twice"),
    ("under a file", _member("metrics.json/x", data=b"x"), "a path under the file 'metrics.json'"),
]


@pytest.mark.parametrize("member,reason", [(m, r) for _, m, r in HOSTILE], ids=[c for c, _, _ in HOSTILE])
def test_hostile_archive_is_refused_in_one_line_and_nothing_is_written(tmp_path, member, reason):
    """Every member is checked before any is placed: not even the good one before the hostile one lands."""
    dest = tmp_path / "out" / "demo"
    dest.mkdir(parents=True)
    with pytest.raises(CliError) as e:
        extract(io.BytesIO(_tar(GOOD, member)), dest, {"final-model", "metrics.json"}, "the tar")
    assert reason in e.value.message and "refused, nothing was written" in e.value.message
    assert "\n" not in e.value.message
    assert list(dest.iterdir()) == [] and list((tmp_path / "out").iterdir()) == [dest]
    assert not (tmp_path / "evil").exists() and not Path("/tmp/evil").exists()


def test_archive_cut_short_is_one_line_and_nothing_is_written(tmp_path):
    whole = _tar(GOOD, _member("final-model/model.safetensors", data=bytes(range(256)) * 200))
    with pytest.raises(CliError) as e, staged(tmp_path / "demo", overwrite=False) as tmp:
        extract(io.BytesIO(whole[: len(whole) // 2]), tmp, {"final-model", "metrics.json"}, "the tar")
    assert "cut short or corrupt" in e.value.message and list(tmp_path.iterdir()) == []


def test_whole_archive_lands_byte_for_byte_and_replaces_only_with_overwrite(tmp_path):
    weights = bytes(range(256)) * 1000
    script = _member("final-model/run.sh", data=b"#!/bin/sh\n")
    script[0].mode, script[0].mtime = 0o4777, 1_700_000_000  # setuid and world-writable: dropped
    archive = _tar(
        GOOD, _member("final-model", tarfile.DIRTYPE), _member("final-model/model.safetensors", data=weights), script
    )
    to = tmp_path / "demo"
    to.mkdir()
    (to / "old.txt").write_text("an older copy")
    with pytest.raises(CliError) as e:
        F.check_destination(to, overwrite=False)
    assert "exists and is not an empty directory" in e.value.message and "--overwrite" in e.value.hint
    with staged(to, overwrite=True) as tmp:
        extract(io.BytesIO(archive), tmp, {"final-model", "metrics.json"}, "the tar")
        assert (to / "old.txt").exists()  # the old copy stays until the new one is whole
    assert (to / "final-model" / "model.safetensors").read_bytes() == weights
    assert (to / "metrics.json").read_bytes() == GOOD[1]
    run_sh = (to / "final-model" / "run.sh").stat()
    assert run_sh.st_mode & 0o7777 == 0o755 and run_sh.st_mtime == 1_700_000_000
    assert sorted(p.name for p in to.iterdir()) == ["final-model", "metrics.json"]  # no spool left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"] and not (to / "old.txt").exists()


def chain_archive(dest: Path, victim: str) -> bytes:
    """CPython's ``test_realpath_limit_attack`` (CVE-2025-4517), every name under ``final-model/`` and none
    with ``..``: directories named so that the symlinks a..p nest past PATH_MAX once expanded, where
    ``os.path.realpath(strict=False)`` (and so tarfile's ``data`` filter before 3.11.13) stops resolving;
    a last link back up, ``escape`` through it to ``dest``'s parent, a hard link to ``victim`` there through
    ``escape``, then the bytes written through the hard link and a new file beside the victim."""
    steps, base = "abcdefghijklmnop", PurePosixPath("final-model")
    dest_len = len(str(dest / "final-model")) + 1
    component = "d" * ((os.pathconf(dest.parent, "PC_PATH_MAX") - dest_len) // (len(steps) + 1))
    members, path = [_member("final-model", tarfile.DIRTYPE)], base
    for step in steps:
        members += [
            _member(str(path / component), tarfile.DIRTYPE),
            _member(str(path / step), tarfile.SYMTYPE, link=component),
        ]
        path = path / component
    link = PurePosixPath(*steps, "l" * 254)
    members += [
        _member(str(base / link), tarfile.SYMTYPE, link="/".join([".."] * len(steps))),
        _member("final-model/escape", tarfile.SYMTYPE, link=f"{link}/../.."),
        _member("final-model/flaglink", tarfile.LNKTYPE, link=f"final-model/escape/{victim}"),
        _member("final-model/flaglink", data=b"overwritten"),
        _member("final-model/escape/newfile", data=b"new"),
    ]
    return _tar(*members)


# ---- the exec stream ----------------------------------------------------------------------------------------


class FrameSocket:
    """websocket-client's ``WebSocket`` as ExecStream reads it: ``recv_data_frame`` gives (opcode, frame)."""

    def __init__(self, frames: list, timeout: float = 5):
        self.frames, self.timeout, self.closed = list(frames), timeout, False

    def recv_data_frame(self, control_frame: bool = False):
        if not self.frames:
            raise WebSocketConnectionClosedException("socket is already closed.")
        frame = self.frames.pop(0)
        if isinstance(frame, Exception):
            raise frame
        return frame.opcode, frame

    def gettimeout(self) -> float:
        return self.timeout

    def close(self) -> None:
        self.closed = True


def _frame(channel: int, data: bytes) -> ABNF:
    return ABNF(opcode=ABNF.OPCODE_BINARY, data=bytes([channel]) + data)


def _frames(stdout: bytes, stderr: bytes = b"", code: int = 0, size: int = 32 * 1024) -> list:
    """What a kubelet sends for an exec: stdout and stderr in frames, the exit status, a close."""
    status = (
        {"metadata": {}, "status": "Success"}
        if code == 0
        else {
            "metadata": {},
            "status": "Failure",
            "reason": "NonZeroExitCode",
            "message": f"command terminated with {code}",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
        }
    )
    out = [_frame(1, stdout[i : i + size]) for i in range(0, len(stdout), size)]
    return [*out, _frame(2, stderr), _frame(3, json.dumps(status).encode()), ABNF(opcode=ABNF.OPCODE_CLOSE)]


def test_exec_stream_is_binary_safe_across_frames_and_counts_progress():
    data = bytes(range(256)) * 513  # every byte value, frames cut mid-sequence
    seen = []
    frames = _frames(data, size=1000)
    frames.insert(2, _frame(255, b"\x02"))  # a v5 channel close: not data
    stream = ExecStream(FrameSocket(frames), "tar in Pod default/p", seen.append)
    got = b"".join(iter(lambda: stream.read(4096), b""))
    stream.finish()
    assert got == data and sum(seen) == len(data)


@pytest.mark.parametrize(
    "frames,expected",
    [
        (
            _frames(b"", b"ok\nPermissionError: [Errno 13] Permission denied: 'index'\n", code=1),
            "failed (exit code 1): PermissionError: [Errno 13] Permission denied: 'index'",
        ),
        (_frames(b"partial")[:1], "the stream ended before the command's exit status"),
        ([_frame(1, b"partial"), WebSocketTimeoutException("timed out")], "the pod sent nothing for 5s"),
    ],
    ids=["non-zero exit", "closed without a status", "stalled"],
)
def test_exec_stream_failures_are_one_line(frames, expected):
    stream = ExecStream(FrameSocket(frames), "tar in Pod default/p")
    with pytest.raises(CliError) as e:
        stream.read()
        stream.finish()
    assert expected in e.value.message and "\n" not in e.value.message


def local_exec(workspace: Path, calls: list | None = None):
    """A stand-in for :func:`operator_cli.kube.fetch.exec_stream`: the pod's own command, run here with
    /workspace mapped to ``workspace``, its output framed as a kubelet frames it."""

    def open_exec(cluster, pod, command, progress=None):
        argv = [sys.executable if a == "python" else a.replace("/workspace", str(workspace), 1) for a in command]
        done = subprocess.run(argv, capture_output=True, check=False)
        if calls is not None:
            calls.append((pod, command))
        return ExecStream(FrameSocket(_frames(done.stdout, done.stderr, done.returncode)), "in the pod", progress)

    return open_exec


# ---- the command, against the emulator ----------------------------------------------------------------------


@pytest.fixture
def api(tmp_path):
    with Emulator(tmp_path, with_v2=True) as emu:
        yield emu


def _add(api: Emulator, objects: list[dict]) -> None:
    for obj in objects:
        plural = {
            "ConfigMap": "v1/configmaps",
            "PyTorchJob": "kubeflow.org/v1/pytorchjobs",
            "TrainJob": "trainer.kubeflow.org/v1alpha1/trainjobs",
        }[obj["kind"]]
        api.add(plural, "default", obj)


def _running(api: Emulator, seen: list) -> None:
    """The kubelet's part: a pod read back is Running (kmock runs no pods); records the pod as stored."""

    def answer(request):
        (pod,) = [p for p in api.objects("pods") if p["metadata"]["name"] == request.name]
        seen.append(pod)
        status = {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "fetch",
                    "ready": True,
                    "restartCount": 0,
                    "image": "x",
                    "imageID": "",
                    "state": {"running": {}},
                }
            ],
        }
        return {**pod, "status": status}

    api.react("get", PODS) << answer


def _claim(root: Path) -> Path:
    """A claim's contents after a job: whole outputs, plus what fetch must leave (checkpoints, temporaries)."""
    out = root / "runs" / "demo"
    (out / "final-model").mkdir(parents=True)
    (out / "final-model" / "model.safetensors").write_bytes(bytes(range(256)) * 4000)
    (out / "final-model" / "README.md").write_text("---\nlibrary_name: PyLate\n---\n")
    (out / "metrics.json").write_text('{"ndcg@10": 0.41}\n')
    (out / "checkpoints" / "step-10").mkdir(parents=True)
    (out / "checkpoints" / "step-10" / "state.pt").write_bytes(b"x" * 100)
    (out / ".tmp-index").mkdir()
    return out


def run(api: Emulator, *args: str):
    return CliRunner().invoke(cli, [*args, "--kubeconfig", str(api.kubeconfig)], catch_exceptions=False)


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_fetch_copies_the_whole_outputs_and_removes_its_pod(api, tmp_path, monkeypatch, kind):
    _add(api, _job(kind))
    claim, seen, calls = tmp_path / "claim", [], []
    out = _claim(claim)
    _running(api, seen)
    monkeypatch.setattr(F, "exec_stream", local_exec(claim, calls))
    to = tmp_path / "here" / "demo"
    res = run(api, "fetch", "demo", "--to", str(to), "--active-deadline", "10m")
    assert res.exit_code == 0, res.output
    assert f"fetched final-model, metrics.json of demo into {to}" in res.output
    assert sorted(p.relative_to(to).as_posix() for p in to.rglob("*")) == [
        "final-model",
        "final-model/README.md",
        "final-model/model.safetensors",
        "metrics.json",
    ]
    for name in ("final-model/model.safetensors", "final-model/README.md", "metrics.json"):
        assert (to / name).read_bytes() == (out / name).read_bytes()
    pod = seen[0]  # the pod the API server stored while the copy ran: read-only claim, labelled, bounded
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "fetch"
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"] == {"claimName": "data", "readOnly": True}
    assert pod["spec"]["activeDeadlineSeconds"] == 600
    assert calls[1][1][3:] == ["/workspace/runs/demo", "final-model", "metrics.json"]
    assert api.objects("pods") == []  # deleted at the end
    assert sorted(p.name for p in to.parent.iterdir()) == ["demo"]


def test_a_failing_copy_leaves_no_pod_and_nothing_half_written(api, tmp_path, monkeypatch):
    _add(api, _job())
    claim = tmp_path / "claim"
    out = _claim(claim)
    (out / "final-model" / "escape").symlink_to("/etc/passwd")  # a hostile claim: refused while extracting
    _running(api, [])
    monkeypatch.setattr(F, "exec_stream", local_exec(claim))
    to = tmp_path / "here" / "demo"
    res = run(api, "fetch", "demo", "--to", str(to))
    assert res.exit_code == 2 and res.output.count("error:") == 1, res.output
    assert "'final-model/escape', a link (fetch copies files and directories only" in res.output
    assert "Traceback" not in res.output
    assert api.objects("pods") == [] and list(to.parent.iterdir()) == []


def _tree(root: Path) -> dict[str, bytes | str]:
    return {
        p.relative_to(root).as_posix(): str(p.readlink())
        if p.is_symlink()
        else p.read_bytes()
        if p.is_file()
        else "dir"
        for p in sorted(root.rglob("*"))
    }


def test_fetch_of_the_cpython_symlink_chain_archive_writes_nothing_anywhere(api, tmp_path, monkeypatch):
    """CVE-2025-4517's archive, on this interpreter whatever its patch level: the first link is refused,
    before anything is placed; the sandboxed home the chain aims at is untouched."""
    _add(api, _job())
    _running(api, [])
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("# mine\n")
    to = home / "demo"
    archive = chain_archive(home / f".demo.fetch-{'0' * 8}", ".bashrc")  # staged's name, its length exact

    def open_exec(cluster, pod, command, progress=None):
        out = (
            archive
            if command[2] == F.TAR
            else json.dumps({"exists": True, "items": ["final-model"], "bytes": len(archive)}).encode()
        )
        return ExecStream(FrameSocket(_frames(out)), "in the pod", progress)

    monkeypatch.setattr(F, "exec_stream", open_exec)
    before = _tree(tmp_path)
    res = run(api, "fetch", "demo", "--to", str(to))
    assert res.exit_code == 2 and res.output.count("error:") == 1, res.output
    assert "'final-model/a', a link (fetch copies files and directories only" in res.output
    assert _tree(tmp_path) == before and (home / ".bashrc").read_text() == "# mine\n"
    assert api.objects("pods") == []


@pytest.mark.parametrize(
    "objects,code,expected",
    [
        (_job(pvc=None, pod_local_storage=True), 2, "has no claim: its /workspace was each pod's emptyDir"),
        (_job(state="Running"), 1, "is Running: fetch copies a finished job's outputs"),
    ],
    ids=["no claim", "running"],
)
def test_fetch_refuses_before_creating_a_pod(api, tmp_path, objects, code, expected):
    _add(api, objects)
    res = run(api, "fetch", "demo", "--to", str(tmp_path / "demo"))
    assert res.exit_code == code and res.output.count("error:") == 1 and expected in res.output, res.output
    assert api.objects("pods") == [] and not (tmp_path / "demo").exists()


def test_fetch_of_a_job_not_created_by_this_tool_is_one_line(api, tmp_path):
    objects = _job()
    objects[-1]["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "helm"}
    _add(api, objects)
    res = run(api, "fetch", "demo", "--to", str(tmp_path / "demo"))
    assert res.exit_code == 1 and res.output.count("error:") == 1 and "was not created by colbert-k8s" in res.output
    assert api.objects("pods") == []


def test_fetch_into_a_non_empty_directory_is_refused_before_any_request(api, tmp_path):
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "keep.txt").write_text("mine")
    res = run(api, "fetch", "demo", "--to", str(tmp_path / "demo"))  # no job at all: never asked
    assert res.exit_code == 2 and "exists and is not an empty directory" in res.output
    assert (tmp_path / "demo" / "keep.txt").read_text() == "mine"


def test_delete_removes_a_leftover_fetch_pod_and_only_its_own(api):
    _add(api, _job(uid=None))
    labels = yaml.safe_load(
        yaml.safe_dump(F.pod_manifest(F.fetch_pod(_job()[-1], lambda: "o", "default", 60, "demo-fetch-1")))
    )
    api.add("v1/pods", "default", labels)
    upload_pod = json.loads(json.dumps(labels))  # a killed `upload`'s pod goes too
    upload_pod["metadata"].update(name="demo-upload-1")
    upload_pod["metadata"]["labels"]["app.kubernetes.io/component"] = "upload"
    api.add("v1/pods", "default", upload_pod)
    other = json.loads(json.dumps(labels))
    other["metadata"].update(name="other-fetch-1")
    other["metadata"]["labels"]["app.kubernetes.io/instance"] = "other"
    api.add("v1/pods", "default", other)
    res = run(api, "delete", "demo")
    assert res.exit_code == 0, res.output
    assert "deleted Pod demo-fetch-1" in res.output.splitlines() and "deleted Pod demo-upload-1" in res.output
    assert [p["metadata"]["name"] for p in api.objects("pods")] == ["other-fetch-1"]


def test_exec_request_reaches_the_api_server_and_a_refusal_is_one_line(api):
    """The real client's exec (kubernetes' ``stream``) up to the websocket handshake, which kmock refuses
    as an API server refuses a user without pods/exec: the query carries the pod's command, argv intact."""
    from operator_cli.kube import Cluster, connect

    asked = []

    def refuse(request):
        asked.append(request)
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "code": 403,
            "reason": "Forbidden",
            "message": 'pods "demo-fetch-1" is forbidden: cannot create resource "pods/exec"',
        }

    api.react("get", "/api/v1/namespaces/default/pods/demo-fetch-1/exec") << 403 << refuse
    cluster = Cluster(connect(str(api.kubeconfig)), "default")
    with pytest.raises(CliError) as e:
        F.exec_stream(cluster, "demo-fetch-1", ["python", "-c", F.TAR, "/workspace/runs/demo", "final-model"])
    assert e.value.message == "cannot exec in Pod default/demo-fetch-1: 403 Forbidden" and e.value.status == 403
    assert "pods/exec" in e.value.hint
    query = asked[0].url.query
    assert query.getall("command") == ["python", "-c", F.TAR, "/workspace/runs/demo", "final-model"]
    assert (query["container"], query["stdout"], query["stderr"], query["stdin"], query["tty"]) == (
        "fetch",
        "true",
        "true",
        "false",
        "false",
    )


# ---- upload: the same pod, writing -------------------------------------------------------------------------


class StdinSocket(FrameSocket):
    """A kubelet's exec with stdin: the frames written on channel 0 are the command's stdin; once the client
    reads, the command runs here on them and its output comes back framed. A client that reads before it has
    closed stdin waits on a pod that waits for more: the read times out, as websocket-client's would.
    ``cut(stdin)``: where the connection drops; the command then runs on the bytes before it."""

    def __init__(self, argv: list[str], cut: Callable[[bytes], int] | None = None):
        super().__init__([])
        self.argv, self.stdin, self.cut = argv, bytearray(), cut
        self.ran = self.stdin_closed = False

    def send(self, payload: bytes, opcode: int = ABNF.OPCODE_BINARY) -> None:
        assert opcode == ABNF.OPCODE_BINARY
        if payload[:1] == b"\x00":
            self.stdin += payload[1:]
        elif payload == bytes([255, 0]):
            self.stdin_closed = True

    def recv_data_frame(self, control_frame: bool = False):
        if not self.ran:
            if not self.stdin_closed and self.cut is None:
                raise WebSocketTimeoutException("timed out")
            self.ran = True
            stdin = bytes(self.stdin[: self.cut(bytes(self.stdin))] if self.cut else self.stdin)
            done = subprocess.run(self.argv, input=stdin, capture_output=True, check=False)
            self.frames = _frames(done.stdout, done.stderr, done.returncode)
        return super().recv_data_frame(control_frame)


def local_upload_exec(workspace: Path, calls: list | None = None, cut: Callable[[bytes], int] | None = None):
    """:func:`operator_cli.kube.fetch.exec_stream` with stdin, its command run here on ``workspace``."""

    def open_exec(cluster, pod, command, progress=None, *, stdin=False, container="fetch"):
        argv = [sys.executable if a == "python" else a.replace("/workspace", str(workspace), 1) for a in command]
        sock = StdinSocket(argv, cut)
        if calls is not None:
            calls.append((pod, container, stdin, sock))
        return ExecStream(sock, "python in the pod", progress)

    return open_exec


class _Recorder:
    """An exec's stdin, kept."""

    def __init__(self):
        self.data = bytearray()

    def write(self, data: bytes) -> int:
        self.data += data
        return len(data)

    def close_stdin(self) -> None:
        pass


def _framed(archive: bytes) -> bytes:
    """A tar as ``upload`` streams it to the pod (:class:`operator_cli.kube.upload._Framed`)."""
    from operator_cli.kube.upload import _Framed

    out = _Recorder()
    framed = _Framed(out)
    for start in range(0, len(archive), WRITE_FRAME):
        framed.write(archive[start : start + WRITE_FRAME])
    framed.end()
    return bytes(out.data)


def _suspended(api: str = "pytorchjob", **opts) -> list[dict]:
    objects = _job(api, state="Suspended", **opts)
    job = objects[-1]
    job["spec"].setdefault("runPolicy", {})["suspend"] = True
    job["spec"]["suspend"] = True  # the TrainJob's field; harmless on a PyTorchJob here
    return objects


def _data(root: Path) -> Path:
    beir = root / "local" / "data" / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_bytes(bytes(range(256)) * 300)
    (beir / "qrels" / "dev.tsv").write_text("q\td\t1\n")
    (root / "local" / "data" / "train.jsonl").write_text('{"query": "q", "positive": "p"}\n')
    return root / "local"


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_upload_pod_is_valid_writable_non_root_labelled_and_owned(api):
    from operator_cli.kube import upload as U

    pod = U.pod_for_job(_suspended(api)[-1], "default", 600)
    manifest = F.pod_manifest(pod)
    validate_core(manifest)
    spec, (container,) = manifest["spec"], manifest["spec"]["containers"]
    assert manifest["metadata"]["labels"]["app.kubernetes.io/component"] == "upload"
    assert manifest["metadata"]["name"].startswith("demo-upload-") and container["name"] == "upload"
    assert spec["volumes"] == [{"name": "workspace", "persistentVolumeClaim": {"claimName": "data"}}]
    assert container["volumeMounts"] == [{"name": "workspace", "mountPath": "/workspace"}]
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["automountServiceAccountToken"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert manifest["metadata"]["ownerReferences"][0]["name"] == "demo"


def test_upload_places_a_directory_and_a_file_and_removes_its_pod(api, tmp_path, monkeypatch):
    _add(api, _suspended())
    claim, seen, calls = tmp_path / "claim", [], []
    claim.mkdir()
    local = _data(tmp_path)
    _running(api, seen)
    monkeypatch.setattr(F, "exec_stream", local_upload_exec(claim, calls))
    monkeypatch.chdir(local)
    res = run(api, "upload", "demo", "data/beir")
    assert res.exit_code == 0, res.output
    assert "uploaded data/beir to claim data at /workspace/data/beir" in res.stdout
    res = run(api, "upload", "demo", str(local / "data" / "train.jsonl"), "data/train.jsonl")
    assert res.exit_code == 0, res.output
    for name in ("data/beir/corpus.jsonl", "data/beir/qrels/dev.tsv", "data/train.jsonl"):
        assert (claim / name).read_bytes() == (local / name).read_bytes()
    assert sorted(p.name for p in (claim / "data").iterdir()) == ["beir", "train.jsonl"]  # no temporary left
    pod = seen[0]
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "upload"
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"] == {"claimName": "data"}
    assert calls[0][1:3] == ("upload", True)  # exec in the upload container, with stdin
    assert api.objects("pods") == []


def test_upload_replaces_an_existing_dest_only_with_overwrite(api, tmp_path, monkeypatch):
    _add(api, _suspended())
    claim = tmp_path / "claim"
    (claim / "data").mkdir(parents=True)
    (claim / "data" / "train.jsonl").write_text("mine\n")
    local = _data(tmp_path)
    _running(api, [])
    monkeypatch.setattr(F, "exec_stream", local_upload_exec(claim))
    monkeypatch.chdir(local)
    res = run(api, "upload", "demo", "data/train.jsonl")
    assert res.exit_code == 2 and res.output.count("error:") == 1, res.output
    assert "/data/train.jsonl already exists on the claim" in res.output and "--overwrite" in res.output
    assert (claim / "data" / "train.jsonl").read_text() == "mine\n" and api.objects("pods") == []
    res = run(api, "upload", "demo", "data/train.jsonl", "--overwrite")
    assert res.exit_code == 0, res.output
    assert (claim / "data" / "train.jsonl").read_bytes() == (local / "data" / "train.jsonl").read_bytes()
    assert sorted(p.name for p in (claim / "data").iterdir()) == ["train.jsonl"]


def test_upload_onto_an_existing_claim_by_name(api, tmp_path, monkeypatch):
    api.add(
        "v1/persistentvolumeclaims",
        "default",
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "shared"}},
    )
    claim, seen = tmp_path / "claim", []
    claim.mkdir()
    local = _data(tmp_path)
    _running(api, seen)
    monkeypatch.setattr(F, "exec_stream", local_upload_exec(claim))
    res = run(api, "upload", "--pvc", "shared", str(local / "data" / "beir"), "corpora/beir")
    assert res.exit_code == 0, res.output
    assert (claim / "corpora" / "beir" / "qrels" / "dev.tsv").read_text() == "q\td\t1\n"
    pod = seen[0]
    assert "ownerReferences" not in pod["metadata"]
    assert pod["metadata"]["labels"]["app.kubernetes.io/instance"] == "shared"
    assert pod["spec"]["containers"][0]["image"].startswith("colbert-k8s/colbert-train:")


@pytest.mark.parametrize(
    "objects,args,code,expected",
    [
        (_job(state="Running"), ["demo", "x"], 1, "is Running: its pods may be reading the claim"),
        (_suspended(pvc=None, pod_local_storage=True), ["demo", "x"], 2, "has no claim: its /workspace is each pod's"),
        ([], ["--pvc", "nope", "x"], 2, "PersistentVolumeClaim default/nope does not exist"),
        ([], ["demo", "x", "../etc"], 2, "DEST ../etc is not under the claim's mount (/workspace)"),
        ([], ["demo"], 2, "upload takes NAME LOCAL_PATH [DEST]"),
    ],
    ids=["running", "no-claim", "no-such-pvc", "dest-outside", "too-few"],
)
def test_upload_refuses_before_creating_a_pod(api, tmp_path, monkeypatch, objects, args, code, expected):
    _add(api, objects)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x").write_text("x")
    res = run(api, "upload", *args)
    assert res.exit_code == code and res.output.count("error:") == 1 and expected in res.output, res.output
    assert api.objects("pods") == []


def test_the_pod_side_refuses_a_member_outside_data_and_writes_nothing(tmp_path):
    """UNTAR trusts no archive: a '..' member is refused and the temporary is removed."""
    from operator_cli.kube.upload import UNTAR

    archive = _framed(_tar(_member("data", tarfile.DIRTYPE), _member("data/../../evil", data=b"x")))
    dest, tmp = tmp_path / "ws" / "data", tmp_path / "ws" / ".data.upload-1"
    done = subprocess.run(
        [sys.executable, "-c", UNTAR, str(dest), str(tmp), "0"], input=archive, capture_output=True, check=False
    )
    assert done.returncode == 1 and b"refused the member 'data/../../evil'" in done.stderr
    assert not (tmp_path / "evil").exists() and not dest.exists() and not tmp.exists()


def _after_corpus(stdin: bytes) -> int:
    """Just after corpus.jsonl's bytes (76800: 150 whole blocks), where the next member's header starts: a
    512-byte boundary of the tar, which tarfile's stream mode takes for the end of the archive."""
    corpus = bytes(range(256)) * 300
    return stdin.rindex(corpus) + len(corpus)


CUTS = {
    "between-members": _after_corpus,
    "inside-a-header": lambda stdin: _after_corpus(stdin) + 100,
    "inside-a-file": lambda stdin: _after_corpus(stdin) - 1000,
    "before-the-end-frame": lambda stdin: len(stdin) - 40,
}


@pytest.mark.parametrize("cut", CUTS.values(), ids=CUTS.keys())
def test_a_cut_upload_leaves_dest_as_it_was(api, tmp_path, monkeypatch, cut):
    """A connection that drops anywhere, at a member's header included, never replaces DEST (--overwrite):
    the pod's UNTAR exits non-zero in one line and the old copy stays whole."""
    _add(api, _suspended())
    claim = tmp_path / "claim"
    (claim / "data" / "beir").mkdir(parents=True)
    old = {"data": "dir", "data/beir": "dir", "data/beir/old.txt": b"the copy the last run trained on\n"}
    (claim / "data" / "beir" / "old.txt").write_bytes(old["data/beir/old.txt"])
    local = _data(tmp_path)
    _running(api, [])
    monkeypatch.setattr(F, "exec_stream", local_upload_exec(claim, cut=cut))
    monkeypatch.chdir(local)
    res = run(api, "upload", "demo", "data/beir", "--overwrite")
    assert res.exit_code == 2 and res.output.count("error:") == 1, res.output
    assert "exit code 1" in res.output and "the upload stream was cut short" in res.output, res.output
    assert "/workspace/data/beir is left as it was" in res.output.replace(str(claim), "/workspace")
    assert _tree(claim) == old
    assert api.objects("pods") == []


def test_the_pod_side_refuses_a_damaged_stream(tmp_path):
    """UNTAR compares the client's SHA-256 with the bytes it read: one byte changed in transit, nothing placed."""
    from operator_cli.kube.archive import send_tree
    from operator_cli.kube.upload import UNTAR

    local, tar = _data(tmp_path), io.BytesIO()
    send_tree(local / "data" / "beir", tar, "data")
    stdin = _framed(tar.getvalue())
    damaged = bytearray(stdin)
    damaged[_after_corpus(bytes(damaged)) - 1] ^= 1
    dest, tmp = tmp_path / "ws" / "beir", tmp_path / "ws" / ".beir.upload-1"
    dest.mkdir(parents=True)
    argv = [sys.executable, "-c", UNTAR, str(dest), str(tmp), "1"]
    done = subprocess.run(argv, input=bytes(damaged), capture_output=True, check=False)
    assert done.returncode == 1 and done.stderr.decode().count("\n") == 1, done.stderr
    assert b"arrived damaged (its SHA-256 differs)" in done.stderr
    assert list(dest.iterdir()) == [] and sorted(p.name for p in dest.parent.iterdir()) == ["beir"]
    done = subprocess.run(argv, input=stdin, capture_output=True, check=False)
    assert done.returncode == 0, done.stderr
    assert (dest / "corpus.jsonl").read_bytes() == (local / "data" / "beir" / "corpus.jsonl").read_bytes()


def test_a_local_file_that_cannot_be_read_is_named_at_once(api, tmp_path, monkeypatch):
    """A dangling link in LOCAL_PATH: one line naming it, before the client waits on the pod (which would
    otherwise wait for the rest of its stdin until the idle timeout); DEST untouched, the pod removed."""
    _add(api, _suspended())
    claim, calls = tmp_path / "claim", []
    (claim / "data" / "beir").mkdir(parents=True)
    local = _data(tmp_path)
    (local / "data" / "beir" / "qrels" / "test.tsv").symlink_to(tmp_path / "gone.tsv")
    _running(api, [])
    monkeypatch.setattr(F, "exec_stream", local_upload_exec(claim, calls))
    monkeypatch.chdir(local)
    res = run(api, "upload", "demo", "data/beir", "--overwrite")
    assert res.exit_code == 2 and res.output.count("error:") == 1, res.output
    assert "cannot read data/beir/qrels/test.tsv: No such file or directory" in res.output, res.output
    assert not calls[0][3].ran  # the client never waited for the pod's status
    assert _tree(claim) == {"data": "dir", "data/beir": "dir"} and api.objects("pods") == []
