"""The chart as a user meets it: docs/helm.md's install line as written, NOTES.txt for the chosen API,
a readable ConfigMap, `helm lint` with the shipped ci/ values, and one line for a missing export credential."""

from __future__ import annotations

import json
import re
import shlex
import subprocess

import helm_python
import pytest
import yaml

from operator_cli import constants as C
from operator_cli.kube.kinds import KINDS
from tests.helpers import ROOT
from tests.helpers.chart import CHART, CONFIG, helm_render
from tests.helpers.schemas import validate_all
from trainer.config.load import load_yaml
from trainer.storage.export import CREDENTIALS


def _notes(values: dict, name: str = "my-run", namespace: str = "ml") -> str:
    with helm_python.Chart.load(str(CHART)) as chart:
        return chart.render(values={"config": CONFIG, **values}, name=name, namespace=namespace)[
            "colbert-train/templates/NOTES.txt"
        ]


NOTES_CASES = [
    ("pytorchjob", {}, "PyTorchJob", f"{C.OPERATOR_REPLICA_TYPE}=master"),
    (
        "pytorchjob",
        {
            "nodes": 3,
            "gpusPerNode": 2,
            "persistence": {"existingClaim": "ckpt"},
            "elastic": "2:4",
            "config": {
                **CONFIG,
                "training": {**CONFIG["training"], "global_batch_size": 24, "per_device_batch_size": 4},
            },
        },
        "PyTorchJob",
        f"{C.OPERATOR_REPLICA_TYPE}=worker,{C.OPERATOR_REPLICA_INDEX}=0",
    ),
    ("trainjob", {}, "TrainJob", f"{C.JOB_COMPLETION_INDEX_LABEL}=0"),
]


@pytest.mark.parametrize("api,values,kind,rank0", NOTES_CASES, ids=["pytorchjob", "pytorchjob-elastic", "trainjob"])
def test_notes_follow_the_api(api, values, kind, rank0):
    """The kind submitted, the kubectl resource, and rank 0's pods by the label the kind's pods carry
    (the same label the CLI's `logs` selects on)."""
    notes = _notes({**values, "api": api})
    assert notes.startswith(f"{kind} my-run submitted to namespace ml:")
    assert f"kubectl get {kind.lower()} my-run -n ml" in notes
    selector = re.search(r"kubectl logs -n ml -f -l (\S+)", notes).group(1)
    assert selector == f"{KINDS[api].pod_selector}=my-run,{rank0}"
    other = "TrainJob" if kind == "PyTorchJob" else "PyTorchJob"
    assert other not in notes and other.lower() not in notes


TRICKY = {
    **CONFIG,
    "model": {"name_or_path": "1e5"},  # a float to YAML 1.2 readers, a string here
    "tracking": {"run_name": "yes", "report_to": ["jsonl"]},
    "output_dir": "out: put\n# not a comment\n\ttab",
    "data": {
        "train": {"path": "2001-12-14", "columns": {"query": "null", "positive": "0x10", "negatives": ["on", "~"]}}
    },
}


@pytest.mark.parametrize("config", [CONFIG, TRICKY], ids=["plain", "strings-that-look-like-other-types"])
def test_configmap_holds_readable_yaml(config):
    """train.yaml is block YAML, one key per line, as the CLI's is (not one line of escaped JSON), and it
    reads back as the very config given, types included."""
    cm = helm_render({"config": config})[0]
    text = cm["data"]["train.yaml"]
    assert "{" not in text.splitlines()[1] and len(text.splitlines()) > 5
    assert "\n  max_steps: 100\n" in text and "\n  learning_rate: 3e-05\n" in text
    assert load_yaml(text) == config
    assert type(load_yaml(text)["training"]["learning_rate"]) is float


def test_bare_lint_needs_config_and_the_ci_values_are_clean():
    """A bare `helm lint` refuses the chart (config is required, as --config is); every ci/*-values.yaml
    (what docs/helm.md's lint line and chart-testing use) lints clean, strict, for both APIs."""
    bare = helm_python.lint(str(CHART), {}, strict=True, kube_version="v1.32.0")
    assert bare["errors"] or any(m["severity"] >= 3 for m in bare["messages"])
    files = sorted((CHART / "ci").glob("*-values.yaml"))
    assert [f.name for f in files] == ["pytorchjob-values.yaml", "trainjob-values.yaml"]
    for path in files:
        values = yaml.safe_load(path.read_text())
        result = helm_python.lint(str(CHART), values, strict=True, kube_version="v1.32.0")
        assert result["errors"] == [], path.name
        assert [m for m in result["messages"] if m["severity"] >= 2] == [], path.name
        validate_all(helm_render(values))
    assert (
        "helm lint charts/colbert-train -f charts/colbert-train/ci/pytorchjob-values.yaml"
        in (ROOT / "docs" / "helm.md").read_text()
    )


def _documented_install() -> str:
    """docs/helm.md's `helm install` command, its continuation lines joined, its trailing comment dropped."""
    text = (ROOT / "docs" / "helm.md").read_text()
    start = text.index("helm install my-run charts/colbert-train")
    lines = []
    for line in text[start:].splitlines():
        lines.append(line.split("   #")[0].rstrip().removesuffix("\\"))
        if not line.rstrip().endswith("\\"):
            break
    return " ".join(lines)


def _set(values: dict, key: str, text: str) -> None:
    *parents, last = key.split(".")
    for part in parents:
        values = values.setdefault(part, {})
    values[last] = yaml.safe_load(text)


def test_documented_install_line_renders_as_written(tmp_path):
    """The --set flags as docs/helm.md gives them and its `-f <(printf ...; sed ...)` run by bash on a real config
    (the quickstart's, comments and all) render a 2-node job that validates."""
    command = _documented_install()
    script = re.search(r"-f <\((.*)\)$", command).group(1)  # process substitution: bash runs it
    args = shlex.split(command[: command.index(" -f <(")])
    assert args[:5] == ["helm", "install", "my-run", "charts/colbert-train", "-n"]
    name, namespace, values = args[2], args[5], {}
    for flag, value in zip(args, args[1:]):
        if flag == "--set":
            _set(values, *value.split("=", 1))
    (tmp_path / "train.yaml").write_text((ROOT / "examples" / "quickstart.yaml").read_text())
    piped = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    values.update(yaml.safe_load(piped))
    objects = helm_render(values, name=name, namespace=namespace)
    validate_all(objects)
    job = objects[-1]
    assert job["kind"] == "PyTorchJob" and job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    assert load_yaml(objects[0]["data"]["train.yaml"]) == load_yaml(piped)["config"]


S3 = {**CONFIG, "export": {"destination": "s3://models/runs/one/"}}
HUB = {**CONFIG, "export": {"destination": "hf://org/model"}}


def _helper_sets() -> dict:
    """The credential sets written into _helpers.tpl (a Go raw string read by `fromJson`)."""
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    return json.loads(re.search(r"\$sets := `([^`]*)` \| fromJson", helpers).group(1))


def test_export_credentials_of_the_chart_are_the_trainers():
    assert _helper_sets() == {scheme: [list(s) for s in sets] for scheme, sets in CREDENTIALS.items()}


@pytest.mark.parametrize(
    "scheme,dest", [(s, "hf://org/model" if s == "hf" else f"{s}://bucket/p/") for s in CREDENTIALS]
)
def test_every_credential_set_is_accepted(scheme, dest):
    for one in CREDENTIALS[scheme]:
        env = {var: {"secret": "creds", "key": var.lower()} for var in one}
        assert helm_render({"config": {**CONFIG, "export": {"destination": dest}}, "secretEnv": env})


@pytest.mark.parametrize(
    "config,values,needle",
    [
        (
            S3,
            {},
            "config.export.destination s3://models/runs/one/ needs credentials in the pods: set secretEnv "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; or AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN; or "
            "AWS_CONTAINER_CREDENTIALS_FULL_URI (each {secret: SECRET, key: KEY}), or serviceAccount.name",
        ),
        (S3, {"secretEnv": {"AWS_ACCESS_KEY_ID": {"secret": "s", "key": "k"}}}, "needs credentials in the pods"),
        (HUB, {"serviceAccount": {"name": "trainer"}}, "config.export.destination hf://org/model needs HF_TOKEN"),
    ],
    ids=["s3-nothing", "s3-half", "hub-service-account"],
)
def test_a_missing_export_credential_is_one_line(config, values, needle):
    with pytest.raises(helm_python.HelmError) as e:
        helm_render({**values, "config": config})
    message = str(e.value)
    assert needle in message and "\n" not in message.strip() and "anyOf" not in message
