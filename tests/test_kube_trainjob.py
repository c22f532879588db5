"""TrainJobs (Kubeflow Trainer v2) over real HTTP against the kmock emulator: auto detection, submit,
status, logs, list and delete, alongside PyTorchJobs."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from operator_cli.cli import cli
from tests.helpers.kube_emulator import Emulator
from tests.helpers.runtimes import MPI_RUNTIME, stock_runtime


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("data:\n  train: {path: data/train.jsonl}\n")
    return path


def run(emu, *args):
    return CliRunner().invoke(cli, [*args, "--kubeconfig", str(emu.kubeconfig)], catch_exceptions=False)


def submit(emu, config, *extra):
    return run(emu, "submit", "--config", str(config), "--name", "demo", "--gpus-per-node", "0", *extra)


@pytest.mark.parametrize(
    "v1, v2, chosen",
    [(True, False, "pytorchjob"), (False, True, "trainjob"), (True, True, "trainjob")],
    ids=["only-v1", "only-v2", "both"],
)
def test_auto_detects_the_served_api(tmp_path, config, v1, v2, chosen):
    with Emulator(tmp_path, with_crd=v1, with_v2=v2, runtimes=(stock_runtime(),)) as emu:
        res = submit(emu, config, "--api", "auto")
        assert res.exit_code == 0, res.output
        assert f"api: auto -> {chosen}" in res.output
        kind = "TrainJob" if chosen == "trainjob" else "PyTorchJob"
        assert f"created {kind} default/demo" in res.output
        assert [o["kind"] for o in emu.objects("trainjobs" if v2 and chosen == "trainjob" else "pytorchjobs")] == [kind]


def test_auto_with_neither_api_is_one_line(tmp_path, config):
    with Emulator(tmp_path, with_crd=False, with_v2=False) as emu:
        res = submit(emu, config, "--api", "auto")
    assert res.exit_code == 2 and res.output.count("error:") == 1
    assert "serves neither trainjobs.trainer.kubeflow.org" in res.output and "Traceback" not in res.output


@pytest.fixture
def v2(tmp_path):
    with Emulator(tmp_path, with_crd=True, with_v2=True, runtimes=(stock_runtime(), MPI_RUNTIME)) as emu:
        yield emu


def test_submit_trainjob_creates_config_and_job(v2, config):
    res = submit(v2, config, "--api", "trainjob", "--secret-env", "HF_TOKEN=hf/token")
    assert res.exit_code == 2 and "Secret default/hf does not exist" in res.output  # preflight as for v1
    res = submit(v2, config, "--api", "trainjob", "--nodes", "2", "--pvc-size", "5Gi")
    assert res.exit_code == 0, res.output
    (job,) = v2.objects("trainjobs")
    assert job["spec"]["runtimeRef"]["name"] == "torch-distributed" and job["spec"]["trainer"]["numNodes"] == 2
    assert [o["metadata"]["name"] for o in v2.objects("configmaps")] == ["demo-config"]
    assert [o["metadata"]["name"] for o in v2.objects("persistentvolumeclaims")] == ["demo-workspace"]


@pytest.mark.parametrize(
    "runtime, message",
    [("nope", "ClusterTrainingRuntime 'nope' does not exist"), ("mpi-distributed", "is for mpi, not torch")],
)
def test_runtime_preflight(v2, config, runtime, message):
    res = submit(v2, config, "--api", "trainjob", "--runtime", runtime)
    assert res.exit_code == 2 and message in res.output and res.output.count("error:") == 1
    assert v2.objects("trainjobs") == [] and v2.objects("configmaps") == []


def test_missing_v2_says_how_to_install(tmp_path, config):
    with Emulator(tmp_path, with_crd=True, with_v2=False) as emu:
        res = submit(emu, config, "--api", "trainjob")
    assert res.exit_code == 2 and "Kubeflow Trainer v2 is not installed" in res.output
    assert "it serves PyTorchJob (--api pytorchjob)" in res.output


def _trainjob(state: str) -> dict:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": "demo",
            "namespace": "default",
            "labels": {"app.kubernetes.io/managed-by": "colbert-k8s", "app.kubernetes.io/instance": "demo"},
        },
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"numNodes": 2, "resourcesPerNode": {"limits": {"nvidia.com/gpu": 4}}},
        },
        "status": {"conditions": [{"type": state, "status": "True", "reason": "x", "message": "m"}]},
    }


def _node_pod(i: int, phase: str, **status) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"demo-node-0-{i}-abcde",
            "namespace": "default",
            "labels": {
                "jobset.sigs.k8s.io/jobset-name": "demo",
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
                "batch.kubernetes.io/job-completion-index": str(i),
            },
        },
        "spec": {"containers": [{"name": "node", "image": "x"}]},
        "status": {"phase": phase, **status},
    }


def test_status_logs_list_delete_of_a_trainjob(v2, config):
    v2.add("trainer.kubeflow.org/v1alpha1/trainjobs", "default", _trainjob("Complete"))
    v2.add("v1/pods", "default", _node_pod(0, "Succeeded"))
    pending = {
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}]
    }
    v2.add("v1/pods", "default", _node_pod(1, "Pending", **pending))
    res = run(v2, "status", "demo")
    assert res.exit_code == 0, res.output
    assert res.output.startswith("demo: Succeeded (TrainJob)")
    node1 = next(line for line in res.output.splitlines() if line.startswith("node-1"))
    assert " 1 " in node1 and "Unschedulable: 0/3 nodes" in node1

    progress = b'[rank 0] INFO progress {"eta_seconds": 0, "percent": 100, "step": 40, "total": 40}'
    for i, text in ((0, b"[rank 0] step 1\n" + progress + b"\n"), (1, b"[rank 1] step 1\n")):
        (
            v2.react("get", f"/api/v1/namespaces/default/pods/demo-node-0-{i}-abcde/log")
            << {"Content-Type": "text/plain"}
            << text
        )
    res = run(v2, "logs", "demo", "--all")
    assert res.output.splitlines() == [
        "[node-0 rank 0] [rank 0] step 1",
        f"[node-0 rank 0] {progress.decode()}",
        "[node-1 rank 1] [rank 1] step 1",
    ]
    assert "progress: step 40/40 (100%), ETA 0m00s" in run(v2, "status", "demo").output  # from node 0's log

    pytorchjob = _trainjob("Running")
    pytorchjob.update(apiVersion="kubeflow.org/v1", kind="PyTorchJob", spec={"pytorchReplicaSpecs": {}})
    pytorchjob["metadata"] = {**pytorchjob["metadata"], "name": "old", "labels": {**pytorchjob["metadata"]["labels"]}}
    pytorchjob["metadata"]["labels"]["app.kubernetes.io/instance"] = "old"
    v2.add("kubeflow.org/v1/pytorchjobs", "default", pytorchjob)
    rows = [line.split() for line in run(v2, "list").output.splitlines()]
    assert rows[0] == ["NAMESPACE", "NAME", "KIND", "STATE", "NODES", "GPUS/NODE", "AGE"]
    assert ["default", "old", "PyTorchJob", "Running", "0", "0", "-"] in rows
    assert ["default", "demo", "TrainJob", "Succeeded", "2", "4", "-"] in rows

    v2.add(
        "v1/configmaps", "default", {"metadata": {"name": "demo-config", "labels": pytorchjob["metadata"]["labels"]}}
    )
    res = run(v2, "delete", "demo")
    assert res.exit_code == 0, res.output
    assert "deleted TrainJob demo" in res.output
    assert v2.objects("trainjobs") == [] and [o["metadata"]["name"] for o in v2.objects("pytorchjobs")] == ["old"]
    assert "kept ConfigMap demo-config (not created by colbert-k8s for demo; left alone)" in res.output
