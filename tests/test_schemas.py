"""The validators the render and chart tests rely on must reject what the API server rejects."""

from __future__ import annotations

import copy

import pytest

from operator_cli.render import render
from operator_cli.spec import JobSpec
from tests.helpers.schemas import CRD_DIR, check_crd, crd_available, validate_pytorchjob

CONFIG = "data:\n  train: {path: data/train.jsonl}\n"


@pytest.fixture(scope="module")
def job() -> dict:
    return render(JobSpec(name="job", config_text=CONFIG, nodes=2, gpus_per_node=1, pvc="ws"))[-1]


def test_rendered_job_is_valid(job):
    validate_pytorchjob(job)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda j: j["spec"].__setitem__("nprocsPerNode", "1"), "unknown field(s) ['nprocsPerNode']"),
        (lambda j: j["spec"]["pytorchReplicaSpecs"]["Master"].__setitem__("replicas", "1"), "expected int"),
        (lambda j: j["spec"]["runPolicy"].__setitem__("backoffLimit", True), "expected int"),
        (lambda j: j["spec"].pop("pytorchReplicaSpecs"), "pytorch_replica_specs"),
        (
            lambda j: j["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0].pop("name"),
            "name",
        ),
        (
            lambda j: j["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"].__setitem__("hostname", 3),
            "expected str",
        ),
    ],
    ids=["unknown-field", "replicas-as-string", "bool-for-int", "missing-required", "container-name", "nested-type"],
)
def test_typed_models_reject_bad_jobs(job, mutate, message):
    bad = copy.deepcopy(job)
    mutate(bad)
    with pytest.raises(AssertionError) as e:
        validate_pytorchjob(bad)
    assert message in str(e.value)


def test_official_crd_layer_runs_only_beside_shared(job):
    """Extra check against ../shared/crds: it rejects an unknown field where present, else is skipped."""
    name = "kubeflow.org_pytorchjobs.yaml"
    if not crd_available(name):
        pytest.skip(f"no {CRD_DIR / name} beside this checkout: the typed-model layer above still ran")
    bad = copy.deepcopy(job)
    bad["spec"]["runPolicy"]["unknownKnob"] = 1
    with pytest.raises(AssertionError, match="unknownKnob"):
        check_crd(bad, name)
