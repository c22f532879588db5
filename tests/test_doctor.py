"""`colbert-k8s doctor` against the emulator: a healthy cluster, then each check failing on its own."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from operator_cli.cli import cli
from operator_cli.kube.runtime import RuntimeSpec, render_runtime
from tests.kube_emulator import Emulator
from tests.test_kube_trainjob import TORCH_RUNTIME

GPU_NODE = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
    "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "96"}},
}
CPU_NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-1"}, "status": {"allocatable": {"cpu": "8"}}}
NFS = {
    "apiVersion": "storage.k8s.io/v1",
    "kind": "StorageClass",
    "metadata": {"name": "shared"},
    "provisioner": "nfs.csi.k8s.io",
}
BLOCK = {
    "apiVersion": "storage.k8s.io/v1",
    "kind": "StorageClass",
    "metadata": {"name": "gp3"},
    "provisioner": "ebs.csi.aws.com",
}


def _deployment(ns: str, name: str, ready: int) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {  # what an API server returns: the client's model requires selector and template
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "manager", "image": "x"}]},
            },
        },
        "status": {"replicas": 1, "readyReplicas": ready},
    }


def _healthy(tmp_path, **overrides) -> Emulator:
    kw = dict(
        with_crd=True,
        with_v2=True,
        runtimes=(TORCH_RUNTIME, render_runtime(RuntimeSpec())),  # the stock one and this tool's
        nodes=(GPU_NODE, CPU_NODE),
        storage_classes=(NFS, BLOCK),
        with_kueue=True,
        namespaces=("default", "ml", "kubeflow", "kubeflow-system"),
    )
    emu = Emulator(tmp_path, **{**kw, **overrides})
    emu.add("apps/v1/deployments", "kubeflow", _deployment("kubeflow", "training-operator", 1))
    emu.add(
        "apps/v1/deployments",
        "kubeflow-system",
        _deployment("kubeflow-system", "kubeflow-trainer-controller-manager", 1),
    )
    emu.add(
        "v1/resourcequotas",
        "ml",
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpus", "namespace": "ml"},
            "status": {"hard": {"requests.nvidia.com/gpu": "16"}, "used": {"requests.nvidia.com/gpu": "8"}},
        },
    )
    emu.add(
        "kueue.x-k8s.io/v1beta1/localqueues",
        "ml",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "LocalQueue",
            "metadata": {"name": "team-a", "namespace": "ml"},
        },
    )  # noqa: E501
    return emu


def doctor(emu, *args):
    return CliRunner().invoke(cli, ["doctor", "-n", "ml", *args, "--kubeconfig", str(emu.kubeconfig)])


def _lines(res) -> dict[str, tuple[str, str]]:
    rows = {}
    for c in json.loads(res.stdout)["checks"]:  # stdout alone: a stray log line on stderr is not the JSON
        rows[c["name"]] = (c["level"], c["detail"])
    return rows


def test_a_healthy_cluster_is_all_ok(tmp_path):
    with _healthy(tmp_path) as emu:
        res = doctor(emu)
        assert res.exit_code == 0, res.output
        lines = res.output.splitlines()
        assert lines[0].split() == ["CHECK", "RESULT", "DETAIL", "HINT"]
        assert all(" OK " in line for line in lines[1:]), res.output
        rows = _lines(doctor(emu, "-o", "json"))
        assert rows["GPU nodes"] == ("OK", "1 node(s): 8 x NVIDIA-H100-80GB-HBM3")
        assert rows["ReadWriteMany storage"][1].startswith("shared")
        assert rows["namespace"] == ("OK", "ml; quota requests.nvidia.com/gpu 8/16")
        assert "team-a" in rows["Kueue queues"][1]
        assert {"may create trainjobs", "may create pytorchjobs", "may create configmaps"} <= set(rows)


FAILURES = [
    # (what is wrong, emulator overrides, deployments to break, check, level, words)
    ("no job API", dict(with_crd=False, with_v2=False), None, "trainjob API", "FAIL", "neither job API is served"),
    (
        "controller down",
        {},
        ("kubeflow-system", "kubeflow-trainer-controller-manager"),
        "trainjob controller",
        "FAIL",
        "0/1 ready",
    ),  # noqa: E501
    ("no torch runtime", dict(runtimes=()), None, "torch runtime", "FAIL", "does not exist"),
    ("no GPU node", dict(nodes=(CPU_NODE,)), None, "GPU nodes", "WARN", "no node has allocatable"),
    ("no RWX class", dict(storage_classes=(BLOCK,)), None, "ReadWriteMany storage", "WARN", "have: gp3"),
    ("no namespace", dict(namespaces=("default",)), None, "namespace", "FAIL", "does not exist"),
    ("no right to create", dict(denied=("trainjobs",)), None, "may create trainjobs", "FAIL", "RBAC: denied"),
]


@pytest.mark.parametrize("what,overrides,broken,check,level,words", FAILURES, ids=[f[0] for f in FAILURES])
def test_each_failing_check_is_one_line_and_sets_the_exit_code(tmp_path, what, overrides, broken, check, level, words):
    with _healthy(tmp_path, **overrides) as emu:
        if broken:
            emu.add("apps/v1/deployments", broken[0], _deployment(*broken, 0))
        res = doctor(emu, "-o", "json")
        assert res.exit_code == {"WARN": 1, "FAIL": 2}[level], res.output
        rows = _lines(res)
        assert rows[check][0] == level and words in rows[check][1], rows[check]
        others = [name for name, (lvl, _) in rows.items() if lvl != "OK" and name != check]
        assert all(rows[n][0] != "FAIL" for n in others) or what == "no job API", others
        table = doctor(emu)
        assert "Traceback" not in table.output and table.exit_code == res.exit_code


def test_asking_for_an_api_that_is_not_served_fails_that_line(tmp_path):
    with _healthy(tmp_path, with_v2=False) as emu:
        rows = _lines(doctor(emu, "--api", "trainjob", "-o", "json"))
        assert rows["trainjob API"][0] == "FAIL" and rows["pytorchjob API"][0] == "OK"
