"""A cluster on which every `colbert-k8s doctor` check passes (the emulator with GPU and CPU nodes, an RWX
class, both operators, a quota and Kueue), `doctor` run against it, and its JSON rows by check name."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner, Result

from operator_cli.cli import cli
from operator_cli.kube.runtime import RuntimeSpec, render_runtime
from tests.helpers.kube_emulator import Emulator
from tests.helpers.runtimes import TORCH_RUNTIME

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


def deployment(ns: str, name: str, ready: int) -> dict:
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


def healthy_cluster(tmp_path: Path, **overrides: object) -> Emulator:
    """The emulator as a cluster where every check passes; ``overrides`` break one part of it."""
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
    emu.add("apps/v1/deployments", "kubeflow", deployment("kubeflow", "training-operator", 1))
    emu.add(
        "apps/v1/deployments",
        "kubeflow-system",
        deployment("kubeflow-system", "kubeflow-trainer-controller-manager", 1),
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


def doctor(emu: Emulator, *args: str) -> Result:
    """``colbert-k8s doctor -n ml`` against ``emu``, through click's runner."""
    return CliRunner().invoke(cli, ["doctor", "-n", "ml", *args, "--kubeconfig", str(emu.kubeconfig)])


def check_rows(res: Result) -> dict[str, tuple[str, str]]:
    """Check name -> (level, detail), from ``-o json``."""
    rows = {}
    for c in json.loads(res.stdout)["checks"]:  # stdout alone: a stray log line on stderr is not the JSON
        rows[c["name"]] = (c["level"], c["detail"])
    return rows
