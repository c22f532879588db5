"""Validate rendered objects the way the API server would: the real CRD schema, and Kubernetes' own."""

from __future__ import annotations

import copy
import functools
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from tests.conftest import SHARED

K8S_VERSION = "1.32.0"


def _structural(node: Any) -> Any:
    """Map the API server's OpenAPI extensions onto plain JSON schema (Draft 4)."""
    if isinstance(node, list):
        return [_structural(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: _structural(v) for k, v in node.items()}
    if node.pop("x-kubernetes-int-or-string", False):
        node.pop("type", None)
        node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.pop("nullable", False) and "type" in node:
        node["type"] = [node["type"], "null"]
    preserve = node.pop("x-kubernetes-preserve-unknown-fields", False)
    if "properties" in node and not preserve and "additionalProperties" not in node:
        node["additionalProperties"] = False  # strict field validation
    return node


@functools.cache
def crd_validator(filename: str = "kubeflow.org_pytorchjobs.yaml") -> jsonschema.Draft4Validator:
    crd = yaml.safe_load((SHARED / "crds" / filename).read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return jsonschema.Draft4Validator(_structural(copy.deepcopy(schema)))


def validate_pytorchjob(obj: dict) -> None:
    errors = sorted(crd_validator().iter_errors(obj), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        raise AssertionError(f"{'/'.join(map(str, e.path))}: {e.message}")
    for rtype, replica in obj["spec"]["pytorchReplicaSpecs"].items():
        pod_template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": f"{obj['metadata']['name']}-{rtype.lower()}"},
            "template": replica["template"],
        }
        validate_core(pod_template)


def validate_core(obj: dict) -> None:
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        raise AssertionError(f"{obj['kind']}: {e.message}") from e


def validate_all(objects: list[dict]) -> None:
    for obj in objects:
        if obj["kind"] == "PyTorchJob":
            validate_pytorchjob(obj)
        else:
            validate_core(obj)
