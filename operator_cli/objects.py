"""The shape of a Kubernetes object as this tool reads and writes it: plain dicts (what the templates render,
what ``CustomObjectsApi`` returns, what ``yaml.safe_load`` gives), typed by the keys that every object
shares. A ``TypedDict`` is a dict at run time, so typing an object changes nothing it does; the
``spec`` and ``status`` of each kind stay open (their schemas are the CRDs', checked by the tests).

>>> obj: KubeObject = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "job-config"}}
>>> obj["metadata"]["name"]
'job-config'
"""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = ["KubeObject", "ObjectMeta"]


class ObjectMeta(TypedDict, total=False):
    """``metadata``: what the tool sets (name, namespace, labels, annotations) and reads back."""

    name: str
    generateName: str
    namespace: str
    labels: dict[str, str]
    annotations: dict[str, str]
    uid: str
    resourceVersion: str
    creationTimestamp: str
    deletionTimestamp: str
    ownerReferences: list[dict[str, Any]]


class KubeObject(TypedDict, total=False):
    """Any object: a manifest before it is created, or what the API server answers."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: dict[str, Any]
    status: dict[str, Any]
    data: dict[str, str]  # a ConfigMap's
