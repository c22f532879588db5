"""submit, status, logs, list and delete over real HTTP against an in-process API (kmock)."""

from __future__ import annotations

import copy

import kmock
import pytest
from click.testing import CliRunner

from operator_cli.cli import cli
from tests.helpers.kube_emulator import Emulator

JOBS = kmock.resource("kubeflow.org", "v1", "pytorchjobs")


@pytest.fixture
def api(tmp_path):
    with Emulator(tmp_path) as emu:
        yield emu


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("data:\n  train: {path: data/train.jsonl}\ntraining: {per_device_batch_size: 32}\n")
    return path


def run(api: Emulator, *args: str):
    res = CliRunner().invoke(cli, [*args, "--kubeconfig", str(api.kubeconfig)], catch_exceptions=False)
    return res


def _submit_args(config, *extra) -> list[str]:
    """A 2 x 8-GPU job named demo (per-pod storage unless the extra flags bring a claim)."""
    storage = () if {"--pvc", "--pvc-size"} & set(extra) else ("--pod-local-storage",)
    return [
        "submit",
        "--config",
        str(config),
        "--name",
        "demo",
        "--nodes",
        "2",
        "--gpus-per-node",
        "8",
        *storage,
        *extra,
    ]


def submit(api, config, *extra):
    return run(api, *_submit_args(config, *extra))


def test_submit_creates_exactly_the_dry_run_objects(api, config):
    import yaml

    dry = CliRunner().invoke(cli, _submit_args(config, "--dry-run"))
    res = submit(api, config)
    assert res.exit_code == 0, res.output
    assert "created PyTorchJob default/demo" in res.output and "colbert-k8s logs demo -f --all" in res.output
    assert "2 node(s) x 8 GPU(s); world size 16 x per-device batch 32 x accumulation 1 = global batch 512" in res.output
    stored = {o["kind"]: copy.deepcopy(o) for o in api.objects("configmaps") + api.objects("pytorchjobs")}
    job_meta, cm_meta = stored["PyTorchJob"]["metadata"], stored["ConfigMap"]["metadata"]
    # the ConfigMap is owned by the job (the API server's uid), so Kubernetes removes it with the job
    assert cm_meta.pop("ownerReferences") == [
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "name": "demo",
            "uid": job_meta["uid"],
            "blockOwnerDeletion": False,
        }
    ]
    for meta in (job_meta, cm_meta):  # what the server set; everything else is what --dry-run printed
        assert {meta.pop("uid"), meta.pop("resourceVersion"), meta.pop("creationTimestamp")} and meta["namespace"]
    expected = {o["kind"]: o for o in yaml.safe_load_all(dry.stdout)}
    assert stored == expected


def test_submit_409_suggests_another_name(api, config):
    assert submit(api, config).exit_code == 0
    res = submit(api, config)
    assert res.exit_code == 2
    assert "error: ConfigMap default/demo-config already exists (409)" in res.output
    assert "--name" in res.output and "Traceback" not in res.output


def _refuse(api, code: int, reason: str, message: str) -> None:
    """Make the API server answer the next PyTorchJob create with this Status."""
    api.react("create", JOBS) << code << {"kind": "Status", "code": code, "reason": reason, "message": message}


def test_refused_job_rolls_back_the_configmap(api, config):
    _refuse(api, 403, "Forbidden", 'pytorchjobs.kubeflow.org is forbidden: User "tester" cannot create')
    res = submit(api, config)
    assert res.exit_code == 2
    lines = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "cannot create PyTorchJob default/demo: 403" in lines[0]
    assert "rolled back ConfigMap demo-config" in lines[0]
    assert "kubectl auth can-i create pytorchjobs -n default" in res.output
    assert api.objects("configmaps") == []


def test_422_invalid_is_one_line(api, config):
    _refuse(api, 422, "Invalid", 'PyTorchJob.kubeflow.org "demo" is invalid: spec.foo: unknown')
    res = submit(api, config)
    assert res.exit_code == 2 and "rejected PyTorchJob default/demo as invalid (422)" in res.output


def test_missing_crd_says_how_to_install(tmp_path, config):
    with Emulator(tmp_path, with_crd=False) as emu:
        res = submit(emu, config)
    assert res.exit_code == 2
    assert "Kubeflow Training Operator is not installed" in res.output and "kubectl apply" in res.output


def test_missing_namespace_secret_and_pvc_are_caught_before_creating(api, config):
    res = submit(api, config, "-n", "nope")
    assert res.exit_code == 2 and "namespace 'nope' does not exist" in res.output
    res = submit(api, config, "--secret-env", "HF_TOKEN=hf/token")
    assert res.exit_code == 2 and "Secret default/hf does not exist" in res.output
    res = submit(api, config, "--pvc", "data")
    assert res.exit_code == 2 and "PersistentVolumeClaim default/data does not exist" in res.output
    assert api.objects("configmaps") == [] and api.objects("pytorchjobs") == []
    api.add(
        "v1/secrets", "default", {"metadata": {"name": "hf", "namespace": "default"}, "data": {"token": "c2VjcmV0"}}
    )
    api.add("v1/persistentvolumeclaims", "default", {"metadata": {"name": "data", "namespace": "default"}})
    res = submit(api, config, "--secret-env", "HF_TOKEN=hf/token", "--pvc", "data")
    assert res.exit_code == 0, res.output
    assert "c2VjcmV0" not in str(api.objects("pytorchjobs"))


def _job_with_status(state: str) -> dict:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": "demo",
            "namespace": "default",
            "labels": {"app.kubernetes.io/managed-by": "colbert-k8s", "app.kubernetes.io/instance": "demo"},
        },
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "pytorch", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 8}}}
                            ]
                        }
                    },
                },
                "Worker": {"replicas": 1},
            }
        },
        "status": {
            "conditions": [
                {"type": "Created", "status": "True", "reason": "PyTorchJobCreated"},
                {"type": state, "status": "True", "reason": f"PyTorchJob{state}"},
            ]
        },
    }


def _status(state: dict, restarts: int = 0, last: dict | None = None) -> dict:
    """The `pytorch` container's status, as the kubelet reports it."""
    status = {"name": "pytorch", "ready": "running" in state, "restartCount": restarts, "image": "x", "imageID": ""}
    return {**status, "state": state, **({"lastState": last} if last else {})}


def _pod(name: str, rtype: str, index: int, phase: str, **status) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {
                "training.kubeflow.org/job-name": "demo",
                "training.kubeflow.org/replica-type": rtype,
                "training.kubeflow.org/replica-index": str(index),
            },
        },
        "spec": {"containers": [{"name": "pytorch", "image": "x"}]},
        "status": {"phase": phase, **status},
    }


def test_status_shows_why_pods_are_stuck(api):
    api.add("kubeflow.org/v1/pytorchjobs", "default", _job_with_status("Running"))
    api.add(
        "v1/pods",
        "default",
        _pod(
            "demo-master-0",
            "master",
            0,
            "Running",
            containerStatuses=[
                _status(
                    restarts=2, state={"running": {}}, last={"terminated": {"reason": "OOMKilled", "exitCode": 137}}
                )
            ],
        ),
    )
    api.add(
        "v1/pods",
        "default",
        _pod(
            "demo-worker-0",
            "worker",
            0,
            "Pending",
            conditions=[
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
                }
            ],
        ),
    )
    res = run(api, "status", "demo")
    assert res.exit_code == 0, res.output
    assert res.output.startswith("demo: Running")
    master = next(line for line in res.output.splitlines() if line.startswith("master-0"))
    worker = next(line for line in res.output.splitlines() if line.startswith("worker-0"))
    assert "OOMKilled (restarted 2x)" in master and " 2 " in master
    assert "Unschedulable: 0/4 nodes are available: 4 Insufficient nvidia.com/gpu." in worker
    assert " 1 " in worker  # worker 0 is node rank 1
    # -o json/yaml: the same fields as the table, parseable
    import json

    import yaml

    record = json.loads(run(api, "status", "demo", "-o", "json").output)
    assert yaml.safe_load(run(api, "status", "demo", "-o", "yaml").output) == record
    assert (record["name"], record["state"], record["kind"]) == ("demo", "Running", "PyTorchJob")
    by_replica = {p["replica"]: p for p in record["pods"]}
    assert by_replica["master-0"]["restarts"] == 2 and "OOMKilled" in by_replica["master-0"]["reason"]
    assert by_replica["worker-0"]["rank"] == 1 and by_replica["worker-0"]["phase"] == "Pending"
    for pod in record["pods"]:  # every field of the table's row is in the record
        row = next(line for line in res.output.splitlines() if line.startswith(pod["replica"]))
        assert all(str(pod[k])[:40] in row for k in ("rank", "pod", "phase", "restarts"))


def test_status_image_pull_backoff(api):
    api.add("kubeflow.org/v1/pytorchjobs", "default", _job_with_status("Created"))
    api.add(
        "v1/pods",
        "default",
        _pod(
            "demo-master-0",
            "master",
            0,
            "Pending",
            containerStatuses=[
                _status(
                    state={"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "reg/x:1"'}}
                )
            ],
        ),
    )
    res = run(api, "status", "demo")
    assert "ImagePullBackOff: Back-off pulling image" in res.output


def test_status_of_missing_job_is_404(api):
    res = run(api, "status", "ghost")
    assert res.exit_code == 1 and "error: PyTorchJob or TrainJob default/ghost not found" in res.output


def test_logs_are_prefixed_by_replica_and_rank(api):
    api.add("kubeflow.org/v1/pytorchjobs", "default", _job_with_status("Succeeded"))
    api.add("v1/pods", "default", _pod("demo-master-0", "master", 0, "Succeeded"))
    api.add("v1/pods", "default", _pod("demo-worker-0", "worker", 0, "Succeeded"))
    for pod, text in (("demo-master-0", b"[rank 0] step 1\n[rank 0] done\n"), ("demo-worker-0", b"[rank 1] step 1\n")):
        api.react("get", f"/api/v1/namespaces/default/pods/{pod}/log") << {"Content-Type": "text/plain"} << text
    res = run(api, "logs", "demo", "--all")
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [
        "[master-0 rank 0] [rank 0] step 1",
        "[master-0 rank 0] [rank 0] done",
        "[worker-0 rank 1] [rank 1] step 1",
    ]
    res = run(api, "logs", "demo", "--rank", "1")
    assert res.output.splitlines() == ["[worker-0 rank 1] [rank 1] step 1"]
    res = run(api, "logs", "demo", "-f", "--poll-interval", "0.1")
    assert "[master-0 rank 0] [rank 0] done" in res.output and res.exit_code == 0


def test_an_elastic_jobs_pods_count_from_worker_0(api):
    """A job of Workers only (``--elastic``) has no Master: worker-0 is rank 0 in status and logs --rank."""
    job = _job_with_status("Running")
    job["spec"]["pytorchReplicaSpecs"] = {"Worker": {**job["spec"]["pytorchReplicaSpecs"]["Master"], "replicas": 2}}
    job["spec"]["elasticPolicy"] = {"minReplicas": 1, "maxReplicas": 2, "rdzvBackend": "c10d"}
    api.add("kubeflow.org/v1/pytorchjobs", "default", job)
    for i in (0, 1):
        api.add("v1/pods", "default", _pod(f"demo-worker-{i}", "worker", i, "Running"))
        (
            api.react("get", f"/api/v1/namespaces/default/pods/demo-worker-{i}/log")
            << {"Content-Type": "text/plain"}
            << f"[rank {i}] step 1\n".encode()
        )
    import json

    record = json.loads(run(api, "status", "demo", "-o", "json").output)
    assert {p["replica"]: p["rank"] for p in record["pods"]} == {"worker-0": 0, "worker-1": 1}
    assert run(api, "logs", "demo").output.splitlines() == ["[worker-0 rank 0] [rank 0] step 1"]
    assert run(api, "logs", "demo", "--rank", "1").output.splitlines() == ["[worker-1 rank 1] [rank 1] step 1"]


def test_list_shows_only_this_tools_jobs(api):
    api.add("kubeflow.org/v1/pytorchjobs", "default", _job_with_status("Running"))
    other = _job_with_status("Running")
    other["metadata"] = {"name": "someone-else", "namespace": "default", "labels": {"app": "x"}}
    api.add("kubeflow.org/v1/pytorchjobs", "default", other)
    res = run(api, "list")
    assert res.exit_code == 0
    rows = res.output.splitlines()
    assert rows[0].split() == ["NAMESPACE", "NAME", "KIND", "STATE", "NODES", "GPUS/NODE", "AGE"]
    assert rows[1].split() == ["default", "demo", "PyTorchJob", "Running", "2", "8", "-"] and len(rows) == 2


def test_delete_removes_everything_it_created(api, config):
    assert submit(api, config, "--pvc-size", "10Gi").exit_code == 0
    res = run(api, "delete", "demo")
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [
        "deleted PyTorchJob demo",
        "deleted ConfigMap demo-config",
        "deleted PersistentVolumeClaim demo-workspace",
    ]
    assert api.objects("pytorchjobs") == [] and api.objects("configmaps") == []
    res = run(api, "delete", "demo")
    assert res.exit_code == 1 and "not found" in res.output


def test_wait_follows_to_the_end(api, config):
    api.react("get", "/apis/kubeflow.org/v1/namespaces/default/pytorchjobs/demo") << _job_with_status("Failed")
    api.add(
        "v1/pods",
        "default",
        _pod(
            "demo-master-0",
            "master",
            0,
            "Failed",
            containerStatuses=[
                _status(
                    restarts=3,
                    state={
                        "waiting": {
                            "reason": "CrashLoopBackOff",
                            "message": "back-off 5m0s restarting failed container",
                        }
                    },
                )
            ],
        ),
    )
    res = submit(api, config, "--wait", "--poll-interval", "0.1")
    assert res.exit_code == 1
    assert "demo: Failed" in res.output and "master-0: CrashLoopBackOff" in res.output


def test_unreachable_cluster_and_missing_kubeconfig(tmp_path, config, monkeypatch):
    import yaml

    kc = tmp_path / "kc"
    kc.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "x",
                "clusters": [{"name": "x", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "x", "context": {"cluster": "x", "user": "u"}}],
            }
        )
    )
    res = CliRunner().invoke(cli, ["list", "--kubeconfig", str(kc)])
    assert res.exit_code == 2 and "cannot reach the cluster at http://127.0.0.1:9" in res.output
    assert "Traceback" not in res.output
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    res = CliRunner().invoke(cli, ["list"])
    assert res.exit_code == 2 and "no kubeconfig found" in res.output


def test_status_reason_from_events(api):
    api.add("kubeflow.org/v1/pytorchjobs", "default", _job_with_status("Created"))
    api.add(
        "v1/pods",
        "default",
        _pod(
            "demo-master-0",
            "master",
            0,
            "Pending",
            containerStatuses=[_status(state={"waiting": {"reason": "ContainerCreating"}})],
        ),
    )
    api.add(
        "v1/events",
        "default",
        {
            "apiVersion": "v1",
            "kind": "Event",
            "type": "Warning",
            "reason": "FailedMount",
            "metadata": {"name": "demo-master-0.1", "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": "demo-master-0", "namespace": "default"},
            "message": 'MountVolume.SetUp failed for volume "config" : configmap "demo-config" not found',
            "lastTimestamp": "2026-11-29T10:00:00Z",
        },
    )
    res = run(api, "status", "demo")
    master = next(line for line in res.output.splitlines() if line.startswith("master-0"))
    assert 'FailedMount: MountVolume.SetUp failed for volume "config"' in master


def test_status_reads_each_pods_events_by_a_field_selector(api):
    """Events are asked for per pod (involvedObject.name=POD), not listed for the whole namespace, and only for a
    pod whose own statuses do not say what is wrong; another pod's warning never lands on this one."""
    api.add("kubeflow.org/v1/pytorchjobs", "default", _job_with_status("Created"))
    creating = [_status(state={"waiting": {"reason": "ContainerCreating"}})]
    api.add("v1/pods", "default", _pod("demo-master-0", "master", 0, "Pending", containerStatuses=creating))
    pulling = [_status(state={"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}})]
    api.add("v1/pods", "default", _pod("demo-worker-0", "worker", 0, "Pending", containerStatuses=pulling))
    warning = {
        "apiVersion": "v1",
        "kind": "Event",
        "type": "Warning",
        "reason": "FailedMount",
        "metadata": {"name": "demo-master-0.1", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": "demo-master-0", "namespace": "default"},
        "message": "configmap not found",
        "lastTimestamp": "2026-11-29T10:00:00Z",
    }
    other = {
        **warning,
        "metadata": {"name": "other.1", "namespace": "default"},
        "reason": "OtherPodsTrouble",
        "involvedObject": {"kind": "Pod", "name": "other", "namespace": "default"},
    }
    selectors = []

    def events(request):  # the whole namespace's events: an API server that ignored the selector
        selectors.append(request.params.get("fieldSelector"))
        return {"apiVersion": "v1", "kind": "EventList", "metadata": {}, "items": [other, warning]}

    api.react("get", "/api/v1/namespaces/default/events") << events
    res = run(api, "status", "demo")
    assert res.exit_code == 0, res.output
    rows = {line.split()[0]: line for line in res.output.splitlines() if line.startswith(("master-0", "worker-0"))}
    assert "FailedMount: configmap not found" in rows["master-0"]
    assert "ImagePullBackOff: no such image" in rows["worker-0"] and "OtherPodsTrouble" not in res.output
    assert selectors == ["involvedObject.name=demo-master-0"]  # one read, narrowed; none for the worker


def test_preflight_skips_checks_it_is_not_allowed_to_make(api, config):
    """A user who may create jobs but not read Secrets still submits; the pods can use the Secret."""
    (
        api.react("get", "/api/v1/namespaces/default/secrets/hf")
        << 403
        << {"kind": "Status", "code": 403, "reason": "Forbidden", "message": 'secrets "hf" is forbidden'}
    )
    res = submit(api, config, "--secret-env", "HF_TOKEN=hf/token")
    assert res.exit_code == 0, res.output
    assert api.objects("pytorchjobs")


def test_broken_kubeconfig_and_unknown_context(tmp_path, api):
    bad = tmp_path / "broken"
    bad.write_text("clusters: [unclosed\n")
    res = CliRunner().invoke(cli, ["list", "--kubeconfig", str(bad)])
    assert res.exit_code == 2 and f"cannot use kubeconfig {bad}" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(cli, ["list", "--kubeconfig", str(api.kubeconfig), "--context", "nope"])
    assert res.exit_code == 2 and "cannot use kubeconfig" in res.output


def test_logs_follow_reattaches_after_a_restart(api):
    """-f streams a pod's log, notices the container restarted, streams the new one, stops at the end."""
    import threading
    import time

    state = {"text": b"[rank 0] step 1\n"}
    api.add("kubeflow.org/v1/pytorchjobs", "default", _job_with_status("Running"))
    api.add(
        "v1/pods",
        "default",
        _pod("demo-master-0", "master", 0, "Running", containerStatuses=[_status(state={"running": {}})]),
    )
    (
        api.react("get", "/api/v1/namespaces/default/pods/demo-master-0/log")
        << {"Content-Type": "text/plain"}
        << (lambda req: state["text"])
    )
    result = {}
    follower = threading.Thread(
        target=lambda: result.update(res=run(api, "logs", "demo", "-f", "--poll-interval", "0.2"))
    )
    follower.start()
    time.sleep(1.0)
    state["text"] = b"[rank 0] resumed from step-1\n"  # the restarted container's log
    api.add(
        "v1/pods",
        "default",
        _pod("demo-master-0", "master", 0, "Running", containerStatuses=[_status(state={"running": {}}, restarts=1)]),
    )
    time.sleep(1.0)
    api.add("kubeflow.org/v1/pytorchjobs", "default", _job_with_status("Succeeded"))
    follower.join(timeout=20)
    assert not follower.is_alive(), "logs -f did not stop when the job ended"
    lines = result["res"].output.splitlines()
    assert lines[0] == "[master-0 rank 0] [rank 0] step 1"
    assert "[master-0 rank 0] --- container restarted (1) ---" in lines
    assert lines[-1] == "[master-0 rank 0] [rank 0] resumed from step-1"
    assert result["res"].exit_code == 0


def test_foreign_job_of_the_same_name_is_never_deleted(api):
    """A PyTorchJob another tool made (no managed-by label): read, refused with one line, left in place."""
    foreign = _job_with_status("Running")
    foreign["metadata"] = {"name": "demo", "namespace": "default", "labels": {"app.kubernetes.io/managed-by": "helm"}}
    api.add("kubeflow.org/v1/pytorchjobs", "default", foreign)
    api.add("v1/configmaps", "default", {"metadata": {"name": "demo-config", "namespace": "default"}})
    for cmd in (["delete", "demo"], ["status", "demo"], ["logs", "demo"]):
        res = run(api, *cmd)
        assert res.exit_code == 1, res.output
        assert "was not created by colbert-k8s" in res.output and res.output.count("error:") == 1
    assert [o["metadata"]["name"] for o in api.objects("pytorchjobs")] == ["demo"]
    assert [o["metadata"]["name"] for o in api.objects("configmaps")] == ["demo-config"]


def test_list_output_formats(api, config):
    import json

    import yaml

    assert submit(api, config).exit_code == 0
    items = json.loads(run(api, "list", "-o", "json").output)["items"]
    assert [(i["name"], i["kind"], i["nodes"], i["gpusPerNode"]) for i in items] == [("demo", "PyTorchJob", 2, 8)]
    assert items[0]["created"]  # the API server's creationTimestamp
    assert yaml.safe_load(run(api, "list", "-o", "yaml").output)["items"] == items
    assert json.loads(run(api, "list", "-n", "ml", "-o", "json").output) == {"items": []}


def test_logs_pass_kubectls_options_to_the_api(api):
    """--tail, --since, --previous and --timestamps reach the API server as its own log parameters."""
    api.add("kubeflow.org/v1/pytorchjobs", "default", _job_with_status("Running"))
    api.add("v1/pods", "default", _pod("demo-master-0", "master", 0, "Running"))
    echo = lambda req: " ".join(f"{k}={v}" for k, v in sorted(req.params.items())).encode() + b"\n"  # noqa: E731
    api.react("get", "/api/v1/namespaces/default/pods/demo-master-0/log") << {"Content-Type": "text/plain"} << echo
    res = run(api, "logs", "demo", "--tail", "5", "--since", "1h30m", "--timestamps", "--previous")
    assert res.exit_code == 0, res.output
    assert res.output.strip() == (
        "[master-0 rank 0] container=pytorch previous=true sinceSeconds=5400 tailLines=5 timestamps=true"
    )
    assert run(api, "logs", "demo").output.strip() == "[master-0 rank 0] container=pytorch"  # nothing extra
    for bad, needle in ((["--since", "5 minutes"], "--since must be a duration"), (["-p", "-f"], "exclude")):
        res = run(api, "logs", "demo", *bad)
        assert res.exit_code == 2 and needle in res.output and res.output.count("error:") == 1


def test_status_watch_prints_each_change_until_the_job_ends(api):
    import threading
    import time

    api.add("kubeflow.org/v1/pytorchjobs", "default", _job_with_status("Running"))

    def finish() -> None:
        time.sleep(1.0)
        api.add("kubeflow.org/v1/pytorchjobs", "default", _job_with_status("Succeeded"))

    threading.Thread(target=finish, daemon=True).start()
    res = run(api, "status", "demo", "--watch", "--poll-interval", "0.1")
    assert res.exit_code == 0, res.output
    heads = [line for line in res.output.splitlines() if line.startswith("demo: ")]
    assert heads == ["demo: Running (PyTorchJob)", "demo: Succeeded (PyTorchJob)"]  # once per change, then it ends


PROGRESS_LOG = (
    b"[rank 0] 10:00:00 INFO step 10/40 loss 0.5000\n"
    b'[rank 0] 10:00:01 INFO progress {"best": {"metric": "ndcg@10", "step": 10, "value": 0.61}, "eta_seconds": 95, '
    b'"loss": 0.25, "percent": 50, "samples_per_second": 16.0, "step": 20, "total": 40}\n'
    b"[rank 0] 10:00:02 INFO something after it\n"
)


def test_status_shows_progress_from_rank_0s_log(api):
    """The trainer's structured line, read from the master's log: step, ETA, speed, loss, best metric."""
    import json

    api.add("kubeflow.org/v1/pytorchjobs", "default", _job_with_status("Running"))
    api.add("v1/pods", "default", _pod("demo-master-0", "master", 0, "Running"))
    (
        api.react("get", "/api/v1/namespaces/default/pods/demo-master-0/log")
        << {"Content-Type": "text/plain"}
        << PROGRESS_LOG
    )
    res = run(api, "status", "demo")
    assert res.exit_code == 0, res.output
    assert (
        "progress: step 20/40 (50%), ETA 1m35s, 16.0 samples/s, loss 0.2500, best ndcg@10 0.6100 at step 10"
        in res.output.splitlines()
    )
    record = json.loads(run(api, "status", "demo", "-o", "json").output)
    assert record["progress"]["step"] == 20 and record["progress"]["best"]["value"] == 0.61


def test_status_shows_the_phase_of_the_whole_job(api, caplog):
    """The line trainer/reporting/progress.py writes while round 2 encodes its corpus, read back by ``status``: the
    phase and the job's percentage, where a line naming the step alone showed the previous round's last step."""
    import json
    import logging

    from trainer.config.load import parse_config
    from trainer.reporting.progress import Progress, job_plan

    cfg = parse_config(
        {
            "data": {"train": {"path": "t.jsonl"}},
            "training": {"max_steps": 4},
            "mine": {"rounds": 2, "retriever": "bm25"},
        }
    )
    progress = Progress(plan=job_plan(cfg, 1, rows=64, queries=64, documents=3000, chunk=512), env={}, interval=0)
    with caplog.at_level(logging.INFO, logger="trainer"):
        progress.round = 1
        progress.skip()
        progress.round = 2
        progress.begin("encode")
        for _ in range(3):
            progress.advance("encode")
    line = caplog.records[-1].getMessage()
    api.add("kubeflow.org/v1/pytorchjobs", "default", _job_with_status("Running"))
    api.add("v1/pods", "default", _pod("demo-master-0", "master", 0, "Running"))
    log = f"[rank 0] 10:00:00 INFO {line}\n".encode()
    api.react("get", "/api/v1/namespaces/default/pods/demo-master-0/log") << {"Content-Type": "text/plain"} << log
    res = run(api, "status", "demo")
    assert res.exit_code == 0, res.output
    shown = next(s for s in res.output.splitlines() if s.startswith("progress:"))
    assert shown.startswith("progress: mining round 2/2: encode corpus 3/6 ("), shown
    assert f"({json.loads(line.split(' ', 1)[1])['percent']}%)" in shown and "step" not in shown
