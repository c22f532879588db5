"""Kubeflow Trainer v2 ClusterTrainingRuntimes: the stock torch-distributed one (from ../shared/crds when
there) and an MPI one, as a cluster serves them."""

from __future__ import annotations

import yaml

from tests.helpers import SHARED

TORCH_RUNTIME = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "torch-distributed", "labels": {"trainer.kubeflow.org/framework": "torch"}},
    "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}},
}
MPI_RUNTIME = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "mpi-distributed", "labels": {"trainer.kubeflow.org/framework": "mpi"}},
    "spec": {"mlPolicy": {"numNodes": 1, "mpi": {}}},
}


def stock_runtime() -> dict:
    """The stock torch-distributed runtime: from ../shared/crds when it is there, else the same facts."""
    path = SHARED / "crds" / "torch_distributed_runtime.yaml"
    return yaml.safe_load(path.read_text()) if path.is_file() else TORCH_RUNTIME
