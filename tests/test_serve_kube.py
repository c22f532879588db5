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
    "volumeMounts",
}
_CORE_POD = {
    "securityContext",
    "serviceAccountName",
    "nodeSelector",
    "tolerations",
    "imagePullSecrets",
    "terminationGracePeriodSeconds",
    "volumes",
}


def _render(*args: str) -> list[dict]:
    res = CliRunner().invoke(cli, ["serve", "render", *args, "-n", "ml"])
    assert res.exit_code == 0, res.output
    return list(yaml.safe_load_all(res.stdout))


def _pod_of(isvc: dict) -> dict:
    """The predictor as a core PodTemplate: its pod fields and the model's container fields."""
    predictor = isvc["spec"]["predictor"]
    container = {k: v for k, v in predictor["model"].items() if k in _CORE_CONTAINER}
    spec = {k: v for k, v in predictor.items() if k in _CORE_POD}
    spec["containers"] = [{"name": "kserve-container", **container}]
    metadata = {"name": "p", "labels": predictor["labels"], "annotations": predictor.get("annotations", {})}
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "p"},
        "template": {"metadata": metadata, "spec": spec},
    }


DEPLOYMENTS = [
    (
        "gpu",
        ["--gpus", "1", "--cpu", "4", "--memory", "16Gi", "--max-batch-size", "16", "--exact"],
        {"nvidia.com/gpu": 1, "cpu": "4", "memory": "16Gi"},
    ),
    ("cpu", ["--max-replicas", "3", "--service-account", "kserve-s3"], {"cpu": "2", "memory": "8Gi"}),
    (
        "platform",
        [
            "--image-pull-secret",
            "regcred",
            "--node-selector",
            "nvidia.com/gpu.product=H100",
            "--toleration",
            "nvidia.com/gpu:NoSchedule",
            "--toleration",
            "dedicated=search:NoExecute",
            "--label",
            "team=search",
            "--annotation",
            "example.com/owner=search team",
            "--ephemeral-storage",
            "20Gi",
            "--gpus",
            "1",
        ],
        {"nvidia.com/gpu": 1, "cpu": "2", "memory": "8Gi"},
    ),
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
    assert model["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "tmp", "mountPath": "/tmp"} in model["volumeMounts"]
    assert "ephemeral-storage" in model["resources"]["requests"]  # a request only: the limits are the above
    # torch and ONNX Runtime size their thread pools by the node's cores, not the pod's: the CPU limit sets them
    threads = next(e for e in model["env"] if e["name"] == "OMP_NUM_THREADS")
    assert threads["valueFrom"] == {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1"}}


SERVE_ENV = [
    ("pytorch", [], {}),
    ("onnx alone", ["--onnx"], {"COLBERT_SERVE_ONNX": "fp32"}),
    ("onnx int8", ["--onnx", "int8"], {"COLBERT_SERVE_ONNX": "int8"}),
    (
        "int8 loss allowed, exact",
        ["--onnx", "int8", "--allow-int8-loss", "--exact"],
        {"COLBERT_SERVE_ONNX": "int8", "COLBERT_SERVE_ALLOW_INT8_LOSS": "1", "COLBERT_SERVE_EXACT": "1"},
    ),
    ("onnx on a gpu", ["--gpus", "1", "--onnx", "fp32"], {"COLBERT_SERVE_ONNX": "fp32"}),
    ("bf16 encoder", ["--precision", "bf16"], {"COLBERT_SERVE_PRECISION": "bf16"}),
    ("fp32 encoder, as without the flag", ["--precision", "fp32"], {}),
]


@pytest.mark.parametrize("name,flags,want", SERVE_ENV, ids=[c[0] for c in SERVE_ENV])
def test_the_predictors_options_reach_its_container_as_environment_variables(monkeypatch, name, flags, want):
    """--exact, --onnx and --allow-int8-loss: the runtime's command is every model's, so the InferenceService's
    container carries them, the object stays CRD-valid, and the predictor reads them back as its options."""
    from trainer.serve.options import parse

    before = CRD_CHECKS["ran"]
    runtime, isvc = _render("s3://models/run-1/", *flags)
    check_crd(runtime, RUNTIME_CRD)
    check_crd(isvc, ISVC_CRD)
    validate_core(_pod_of(isvc))
    if crd_available(ISVC_CRD):
        assert CRD_CHECKS["ran"] == before + 2
    env = {e["name"]: e["value"] for e in isvc["spec"]["predictor"]["model"]["env"] if "value" in e}
    assert {k: v for k, v in env.items() if k.startswith("COLBERT_SERVE_")} == want
    for key in (
        "COLBERT_SERVE_EXACT",
        "COLBERT_SERVE_ONNX",
        "COLBERT_SERVE_ALLOW_INT8_LOSS",
        "COLBERT_SERVE_PRECISION",
    ):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    args = parse(["/mnt/models"])
    assert (args.exact, args.onnx, args.allow_int8_loss, args.precision) == (
        "--exact" in flags,
        want.get("COLBERT_SERVE_ONNX"),
        "--allow-int8-loss" in flags,
        want.get("COLBERT_SERVE_PRECISION", "fp32"),
    )


def test_onnx_on_a_gpu_is_served_with_a_note():
    """ONNX Runtime encodes on the CPU; the GPU still runs the search, so the pair is allowed and said once."""
    res = CliRunner().invoke(cli, ["serve", "render", "s3://m/r/", "--gpus", "1", "--onnx", "-n", "ml"])
    assert res.exit_code == 0, res.output
    assert res.stderr.strip() == "note: --onnx encodes on the CPU; the GPU runs the search (PLAID or --exact) only"
    assert len(list(yaml.safe_load_all(res.stdout))) == 2
    assert "note:" not in CliRunner().invoke(cli, ["serve", "render", "s3://m/r/", "--onnx", "-n", "ml"]).stderr


def test_the_precisions_are_the_engines_own():
    from operator_cli.kube.kinds.inferenceservice import PRECISIONS
    from trainer.serve.options import PRECISIONS as TRAINER
    from trainer.serve.options import parser

    (precision,) = [a for a in parser()._actions if a.dest == "precision"]
    assert TRAINER == PRECISIONS == tuple(precision.choices)


def test_bf16_beside_onnx_is_refused_in_one_line():
    res = CliRunner().invoke(cli, ["serve", "render", "s3://m/r/", "--onnx", "--precision", "bf16", "-n", "ml"])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert res.output.splitlines()[0] == "error: --precision bf16 is the PyTorch encoder's; --onnx fp32 has its own"


def test_the_onnx_forms_are_the_exports_own():
    from operator_cli.kube.kinds.inferenceservice import ONNX_FORMS
    from trainer.onnx_export import FORMS
    from trainer.serve.options import parser

    (onnx,) = [a for a in parser()._actions if a.dest == "onnx"]
    assert tuple(FORMS) == ONNX_FORMS == tuple(onnx.choices)


@pytest.mark.parametrize(
    "args",
    [
        ["--onnx", "render", "s3://m/r/"],
        ["--onnx", "int8", "render", "s3://m/r/"],
        ["--allow-int8-loss", "apply", "x"],
        ["--precision", "bf16", "render", "s3://m/r/"],
    ],
    ids=["bare before render", "form before render", "allow before apply", "precision before render"],
)
def test_onnx_before_the_subcommand_points_after_it(args):
    res = CliRunner().invoke(cli, ["serve", *args])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert res.output.splitlines() == [
        "error: --onnx, --allow-int8-loss and --precision go with --local, or after render or apply",
        "hint: serve render NAME|URI --onnx [fp32|int8] (or apply), or serve --local URI --onnx [fp32|int8]",
    ]


def test_serve_render_takes_the_job_commands_pod_flags():
    """The scheduling and metadata flags of the job commands, on the InferenceService and its pods."""
    _, isvc = _render(
        "s3://models/run-1/",
        "--image-pull-secret",
        "regcred",
        "--node-selector",
        "pool=gpu",
        "--toleration",
        "nvidia.com/gpu:NoSchedule",
        "--label",
        "team=search",
        "--annotation",
        "example.com/owner=me",
        "--ephemeral-storage",
        "20Gi",
    )
    predictor = isvc["spec"]["predictor"]
    assert predictor["imagePullSecrets"] == [{"name": "regcred"}]
    assert predictor["nodeSelector"] == {"pool": "gpu"}
    assert predictor["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert isvc["metadata"]["labels"]["team"] == "search" and predictor["labels"]["team"] == "search"
    assert isvc["metadata"]["labels"]["app.kubernetes.io/component"] == "serve"
    assert isvc["metadata"]["annotations"] == {
        "serving.kserve.io/deploymentMode": "RawDeployment",
        "example.com/owner": "me",
    }
    assert predictor["annotations"] == {"example.com/owner": "me"}
    assert predictor["model"]["resources"]["requests"]["ephemeral-storage"] == "20Gi"


def test_the_serve_pod_flags_are_the_job_options_themselves():
    """Declared once: the same Option objects as submit's, so the help and the rules cannot drift."""
    from operator_cli.kube.kinds.inferenceservice import POD_OPTIONS
    from operator_cli.options import JOB_OPTIONS

    assert all(any(option is job for job in JOB_OPTIONS) for option in POD_OPTIONS)
    help_text = CliRunner().invoke(cli, ["serve", "render", "--help"]).output
    assert all(option.flag in help_text for option in POD_OPTIONS) and "--ephemeral-storage" in help_text


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
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "secretKeyRef" in e.get("valueFrom", {})}
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
        (["s3:///x"], "the export 's3:///x': s3:// names no bucket; give s3://BUCKET/PREFIX/"),
        (["gs://b/../x"], "the prefix holds '.' or '..'"),
        (["pvc:///x"], "names no pvc:// host, claim or repository"),
        (["s3://m/r/", "--label", "app.kubernetes.io/component=x"], "--label app.kubernetes.io/component is set by"),
        (["s3://m/r/", "--label", "team=a b"], "--label value for team must be a label value"),
        (["s3://m/r/", "--annotation", "serving.kserve.io/deploymentMode=Serverless"], "is set by colbert-k8s"),
        (["s3://m/r/", "--toleration", "gpu"], "--toleration"),
        (["s3://m/r/", "--image-pull-secret", "Bad_Secret"], "--image-pull-secret must be a DNS-1123 name"),
        (["s3://m/r/", "--node-selector", "pool"], "--node-selector"),
        (["s3://m/r/", "--ephemeral-storage", "lots"], "--ephemeral-storage must be a Kubernetes quantity"),
        (["s3://m/r/", "--onnx", "fp16"], "'fp16' is not one of 'fp32', 'int8'"),
        (["s3://m/r/", "--allow-int8-loss"], "--allow-int8-loss goes with --onnx int8, got --onnx (none)"),
        (["s3://m/r/", "--onnx", "--allow-int8-loss"], "--allow-int8-loss goes with --onnx int8, got --onnx fp32"),
        (
            ["s3://m/r/", "--annotation", "example.com/token=ghp_" + "a" * 36],
            "--annotation example.com/token holds",
        ),
    ],
    ids=[
        "scheme",
        "gpus",
        "cpu",
        "name",
        "batch",
        "empty bucket",
        "dot-dot prefix",
        "empty claim",
        "own label",
        "bad label",
        "deployment mode",
        "bad toleration",
        "bad pull secret",
        "bad node selector",
        "ephemeral storage",
        "onnx form",
        "int8 loss without onnx",
        "int8 loss with fp32",
        "token in annotation",
    ],
)
def test_a_bad_flag_is_one_line(args, message):
    res = CliRunner().invoke(cli, ["serve", "render", *args])
    assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output, res.output
    assert len(res.output.strip().splitlines()) <= 2  # the error, and its hint


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
    refused = _run(api, "serve", "apply", "s3://models/run-1/", "-n", "ml", "--allow-int8-loss")
    assert refused.exit_code == 2 and "--allow-int8-loss goes with --onnx int8" in refused.output
    assert not made and api.objects("inferenceservices") == []
    res = _run(api, "serve", "apply", "s3://models/run-1/", "-n", "ml", "--onnx", "int8")
    assert res.exit_code == 0, res.output
    assert "created ClusterServingRuntime colbert-k8s" in res.output and "created InferenceService run-1" in res.output
    assert made and made[0]["kind"] == "ClusterServingRuntime"
    (isvc,) = api.objects("inferenceservices")
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == "s3://models/run-1/"
    assert {"name": "COLBERT_SERVE_ONNX", "value": "int8"} in isvc["spec"]["predictor"]["model"]["env"]
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
