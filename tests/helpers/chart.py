"""The Helm chart rendered through Helm's own Go SDK (helm-python-sdk), and what may differ between its
objects and `colbert-k8s render`'s (the Helm-only labels and annotations), for the chart and ops tests."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import helm_python
import yaml

from tests.helpers import ROOT
from trainer.config.load import load_yaml

CHART = ROOT / "charts" / "colbert-train"


# floats of every shape Helm's JSON numbers take (3e-05 is a string to YAML 1.1 readers)
CONFIG = {
    "data": {"train": {"path": "data/train.jsonl"}},
    "training": {"per_device_batch_size": 32, "max_steps": 100, "learning_rate": 3e-05, "warmup_ratio": 0.1},
    "loss": {"name": "contrastive", "temperature": 0.02},
}

# The only differences allowed between the chart and the CLI, each Helm-specific:
HELM_ONLY_LABELS = {"helm.sh/chart"}  # every object: which chart version made it


HELM_ONLY_ANNOTATIONS = {"helm.sh/resource-policy"}  # the created PVC survives `helm uninstall`


def helm_render(values: dict, name: str = "job", namespace: str = "default") -> list[dict]:
    """The chart's objects for ``values``; the config is CONFIG unless the values bring one (it is required)."""
    values = {"config": CONFIG, **values}
    with helm_python.Chart.load(str(CHART)) as chart:
        out = chart.render(values=values, name=name, namespace=namespace)
    docs = []
    for path, text in sorted(out.items()):
        if path.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    order = {
        "ClusterTrainingRuntime": -1,
        "ConfigMap": 0,
        "PersistentVolumeClaim": 1,
        "ServiceAccount": 2,
        "PyTorchJob": 3,
        "TrainJob": 3,
    }
    return sorted(docs, key=lambda d: order[d["kind"]])


def normalise(objects: list[dict]) -> list[dict]:
    """The chart's objects less what only Helm adds, the ConfigMap's config as typed data."""
    out = []
    for obj in copy.deepcopy(objects):
        for meta in metas(obj):
            for key in HELM_ONLY_LABELS:
                meta.get("labels", {}).pop(key, None)
            for key in HELM_ONLY_ANNOTATIONS:
                meta.get("annotations", {}).pop(key, None)
            if meta.get("annotations") == {}:
                del meta["annotations"]
        if obj["kind"] == "ConfigMap":  # the CLI ships the user's file as written; compare it as typed data
            obj["data"] = {k: typed(load_yaml(v)) for k, v in obj["data"].items()}
        out.append(obj)
    return out


def typed(value: object) -> object:
    """Data with its types made visible, so 3e-05 (float) and "3e-05" (str) compare unequal."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    return (type(value).__name__, value)


def metas(obj: dict) -> Iterator[dict]:
    """Every metadata of ``obj``: its own and its pod templates', through either job API."""
    yield obj["metadata"]
    for replica in obj.get("spec", {}).get("pytorchReplicaSpecs", {}).values():
        yield replica["template"]["metadata"]
    for patch in obj.get("spec", {}).get("runtimePatches", []):
        for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
            yield job["template"]["spec"]["template"]["metadata"]
