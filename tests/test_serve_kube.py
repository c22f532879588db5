"""``colbert-k8s serve render|apply|list|delete``: the InferenceService and its ClusterServingRuntime are valid
against KServe's CRDs (../shared/crds) for a GPU and a CPU deployment, name Secrets by reference only, and are
created, listed and deleted over real HTTP against an in-process API (kmock)."""

from __future__ import annotations

import json

import kmock
import pytest
import yaml
from click.testing import CliRunner

from operator_cli.cli import cli
from tests.helpers.kube_emulator import Emulator
from tests.helpers.schemas import CRD_CHECKS, check_crd, crd_available, validate_core
from trainer.config.credentials import credential_in

ISVC_CRD = "serving.kserve.io_inferenceservices.yaml"
RUNTIME_CRD = "serving.kserve.io_clusterservingruntimes.yaml"
ISVCS = kmock.resource("serving.kserve.io", "v1beta1", "inferenceservices")
_CORE_CONTAINER = {
    "name",
    "image",
    "command",
    "args",
    "env",
    "ports",
    "resources",
    "readinessProbe",
    "livenessProbe",
    "startupProbe",
    "securityContext",
}


def _render(*args: str) -> list[dict]:
    res = CliRunner().invoke(cli, ["serve", "render", *args, "-n", "ml"])
    assert res.exit_code == 0, res.output
    return list(yaml.safe_load_all(res.stdout))


def _pod_of(isvc: dict) -> dict:
    """The predictor as a core PodTemplate: its pod fields and the model's container fields."""
    predictor = isvc["spec"]["predictor"]
    container = {k: v for k, v in predictor["model"].items() if k in _CORE_CONTAINER}
    spec = {"securityContext": predictor["securityContext"], "containers": [{"name": "kserve-container", **container}]}
    if "serviceAccountName" in predictor:
        spec["serviceAccountName"] = predictor["serviceAccountName"]
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "p"}, "template": {"spec": spec}}


DEPLOYMENTS = [
    (
        "gpu",
        ["--gpus", "1", "--cpu", "4", "--memory", "16Gi", "--max-batch-size", "16", "--exact"],
        {"nvidia.com/gpu": 1, "cpu": "4", "memory": "16Gi"},
    ),
    ("cpu", ["--max-replicas", "3", "--service-account", "kserve-s3"], {"cpu": "2", "memory": "8Gi"}),
]


@pytest.mark.parametrize("name,flags,limits", DEPLOYMENTS, ids=[d[0] for d in DEPLOYMENTS])
def test_the_rendered_inference_service_is_crd_valid(name, flags, limits):
    before = CRD_CHECKS["ran"]
    runtime, isvc = _render("s3://models/run-1/", "--secret-env", "AWS_SECRET_ACCESS_KEY=s3-creds/secret", *flags)
    check_crd(runtime, RUNTIME_CRD)
    check_crd(isvc, ISVC_CRD)
    validate_core(_pod_of(isvc))
    if crd_available(ISVC_CRD):
        assert CRD_CHECKS["ran"] == before + 2
    model = isvc["spec"]["predictor"]["model"]
    assert model["storageUri"] == "s3://models/run-1/" and model["runtime"] == runtime["metadata"]["name"]
    assert model["resources"]["limits"] == limits
    assert isvc["metadata"]["name"] == "run-1" and model["readinessProbe"]["httpGet"]["path"] == "/v1/models/run-1"
    assert isvc["spec"]["predictor"]["securityContext"]["runAsNonRoot"] is True
    assert runtime["spec"]["containers"][0]["args"][1] == "--model-name={{.Name}}"


def test_the_rendered_objects_name_no_secret_value():
    objects = _render(
        "s3://models/run-1/",
        "--secret-env",
        "AWS_ACCESS_KEY_ID=s3-creds/id",
        "--secret-env",
        "AWS_SECRET_ACCESS_KEY=s3-creds/secret",
        "-o",
        "yaml",
    )
    env = objects[1]["spec"]["predictor"]["model"]["env"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "valueFrom" in e}
    assert refs == {
        "AWS_ACCESS_KEY_ID": {"name": "s3-creds", "key": "id"},
        "AWS_SECRET_ACCESS_KEY": {"name": "s3-creds", "key": "secret"},
    }
    assert all("value" not in e for e in env if e["name"].startswith("AWS_"))
    assert credential_in(json.dumps(objects)) is None
    res = CliRunner().invoke(cli, ["serve", "render", "s3://key:secret@models/run-1/"])
    assert res.exit_code == 2 and "holds a URL with user:password@" in res.output and "secret@" not in res.output


@pytest.mark.parametrize(
    "args,message",
    [
        (["ftp://x/y"], "the export must be a URI KServe can fetch"),
        (["s3://m/r/", "--gpus", "99"], "--gpus must be"),
        (["s3://m/r/", "--cpu", "lots"], "--cpu must be a Kubernetes quantity"),
        (["s3://m/r/", "--name", "Bad_Name"], "--name must be a DNS-1035 label"),
        (["s3://m/r/", "--max-batch-size", "1000"], "--max-batch-size must be from 1 to 64"),
    ],
    ids=["scheme", "gpus", "cpu", "name", "batch"],
)
def test_a_bad_flag_is_one_line(args, message):
    res = CliRunner().invoke(cli, ["serve", "render", *args])
    assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output


@pytest.fixture
def api(tmp_path):
    with Emulator(tmp_path) as emu:
        emu.emu.resources["serving.kserve.io/v1beta1/inferenceservices"] = kmock.ResourceInfo(
            kind="InferenceService", namespaced=True
        )
        yield emu


def _run(api, *args: str):
    return CliRunner().invoke(cli, [*args, "--kubeconfig", str(api.kubeconfig)], catch_exceptions=False)


def test_apply_list_delete_a_served_model(api):
    runtime_path = "/apis/serving.kserve.io/v1alpha1/clusterservingruntimes"
    made = []
    api.react(f"get {runtime_path}/colbert-k8s") << 404 << {"kind": "Status", "code": 404, "reason": "NotFound"}
    api.react(f"post {runtime_path}") << 201 << (lambda req: made.append(req.data) or req.data)
    res = _run(api, "serve", "apply", "s3://models/run-1/", "-n", "ml")
    assert res.exit_code == 0, res.output
    assert "created ClusterServingRuntime colbert-k8s" in res.output and "created InferenceService run-1" in res.output
    assert made and made[0]["kind"] == "ClusterServingRuntime"
    (isvc,) = api.objects("inferenceservices")
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == "s3://models/run-1/"
    again = _run(api, "serve", "apply", "s3://models/run-1/", "-n", "ml")
    assert again.exit_code != 0 and "already exists" in again.output and "serve delete run-1" in again.output
    listed = _run(api, "serve", "list", "-n", "ml")
    assert listed.exit_code == 0 and "run-1" in listed.output and "s3://models/run-1/" in listed.output
    api.add(
        "serving.kserve.io/v1beta1/inferenceservices",
        "ml",
        {
            "apiVersion": "serving.kserve.io/v1beta1",
            "kind": "InferenceService",
            "metadata": {"name": "theirs", "namespace": "ml", "labels": {"team": "search"}},
            "spec": {"predictor": {}},
        },
    )
    assert "theirs" not in _run(api, "serve", "list", "-n", "ml").output
    refused = _run(api, "serve", "delete", "theirs", "-n", "ml")
    assert refused.exit_code == 1 and "not created by colbert-k8s serve; left alone" in refused.output
    gone = _run(api, "serve", "delete", "run-1", "-n", "ml")
    assert gone.exit_code == 0 and "deleted InferenceService run-1" in gone.output
    assert [i["metadata"]["name"] for i in api.objects("inferenceservices")] == ["theirs"]
