"""The Helm chart, through Helm's own Go SDK (helm-python-sdk): lint, schema sync, render matrix, and
object-for-object equivalence with `colbert-k8s render`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import helm_python
import pytest
import yaml

from operator_cli.render import render
from operator_cli.spec import JobSpec, SecretRef
from tests.helpers import ROOT
from tests.helpers.chart import CHART, CONFIG, HELM_ONLY_LABELS, helm_render, normalise, typed
from tests.helpers.schemas import validate_all
from trainer.config.load import load_yaml


def test_lint_strict_is_clean():
    result = helm_python.lint(str(CHART), {"config": CONFIG}, strict=True, kube_version="v1.32.0")
    assert result["errors"] == []
    assert [m for m in result["messages"] if m["severity"] >= 2] == []


def test_values_schema_is_generated_from_the_trainer_schema():
    res = subprocess.run(
        [sys.executable, "-m", "operator_cli.chart_schema", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr


def test_schema_drift_would_be_caught(tmp_path, monkeypatch, capsys):
    """``--check`` really compares: a values.schema.json that lacks one config key (as when someone
    adds a key to TrainConfig and forgets to regenerate) makes it exit 1 with the command to run."""
    from operator_cli import chart_schema

    stale = json.loads((CHART / "values.schema.json").read_text())
    del stale["$defs"]["train.TrainingConfig"]["properties"]["max_steps"]
    (tmp_path / "values.schema.json").write_text(json.dumps(stale, indent=2) + "\n")
    monkeypatch.setattr(chart_schema, "CHART", tmp_path)
    monkeypatch.setattr(sys, "argv", ["chart_schema", "--check"])
    with pytest.raises(SystemExit) as e:
        chart_schema.main()
    assert e.value.code == 1 and "is out of date: run python -m operator_cli.chart_schema" in capsys.readouterr().err
    (tmp_path / "values.schema.json").write_text((CHART / "values.schema.json").read_text())
    chart_schema.main()  # the real file, copied: the same check passes


OPTION_SETS = {
    "defaults": ({}, {}),
    "cpu-2-nodes-pod-local": (
        dict(nodes=2, gpus_per_node=0, pod_local_storage=True, termination_grace=300),
        dict(nodes=2, gpusPerNode=0, persistence={"podLocal": True}, terminationGracePeriodSeconds=300),
    ),
    "2x8-ib-resources": (
        dict(nodes=2, gpus_per_node=8, nccl="ib", cpu="32", memory="256Gi", pvc="ckpt"),
        dict(
            nodes=2,
            gpusPerNode=8,
            nccl="ib",
            resources={"cpu": "32", "memory": "256Gi"},
            persistence={"existingClaim": "ckpt"},
        ),
    ),
    "new-pvc": (
        dict(nodes=3, pvc_size="500Gi", storage_class="fast"),
        dict(nodes=3, persistence={"size": "500Gi", "storageClass": "fast"}),
    ),
    "existing-pvc-no-shm": (
        dict(pvc="shared", shm_size=None),
        dict(persistence={"existingClaim": "shared"}, shm={"enabled": False}),
    ),
    "scheduling": (
        dict(
            nodes=4,
            gpus_per_node=4,
            node_selector={"nvidia.com/gpu.product": "H100"},
            tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            priority_class="high",
            queue="team-a",
            service_account="trainer",
            pod_local_storage=True,
        ),
        dict(
            nodes=4,
            gpusPerNode=4,
            scheduling={
                "nodeSelector": {"nvidia.com/gpu.product": "H100"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "priorityClassName": "high",
                "queue": "team-a",
            },
            serviceAccount={"name": "trainer"},
            persistence={"podLocal": True},
        ),
    ),
    "env-secrets-image": (
        dict(
            image="reg.example.com/colbert-train:1.2",
            image_pull_secrets=["regcred"],
            env={"WANDB_MODE": "offline", "A_FIRST": "x: y"},
            secret_env={"HF_TOKEN": SecretRef("hf", "token")},
        ),
        dict(
            image={"repository": "reg.example.com/colbert-train", "tag": "1.2"},
            imagePullSecrets=["regcred"],
            env={"WANDB_MODE": "offline", "A_FIRST": "x: y"},
            secretEnv={"HF_TOKEN": {"secret": "hf", "key": "token"}},
        ),
    ),
    "lifetime-metadata": (
        dict(
            backoff_limit=0,
            active_deadline=None,
            ttl_after_finished=600,
            labels={"team": "search"},
            annotations={"example.com/owner": "alice"},
        ),
        dict(
            runPolicy={"backoffLimit": 0, "activeDeadlineSeconds": 0, "ttlSecondsAfterFinished": 600},
            labels={"team": "search"},
            annotations={"example.com/owner": "alice"},
        ),
    ),
    "ib-derived-requests": (
        dict(nodes=2, gpus_per_node=4, nccl="ib", pvc="ckpt", shm_size="1.5G"),
        dict(nodes=2, gpusPerNode=4, nccl="ib", persistence={"existingClaim": "ckpt"}, shm={"size": "1.5G"}),
    ),
    "ib-other-rdma-plugin-memory-given": (
        dict(gpus_per_node=2, nccl="ib", rdma_resource="nvidia.com/hostdev", memory="64Gi"),
        dict(gpusPerNode=2, nccl="ib", rdmaResource="nvidia.com/hostdev", resources={"memory": "64Gi"}),
    ),
    "ib-no-rdma-device-cpu-given": (
        dict(gpus_per_node=8, nccl="ib", rdma_resource=None, cpu="48", shm_size="512Mi"),
        dict(gpusPerNode=8, nccl="ib", rdmaResource="", resources={"cpu": "48"}, shm={"size": "512Mi"}),
    ),
    "socket-16-nodes": (
        dict(nodes=16, gpus_per_node=8, nccl="socket", pvc="ckpt"),
        dict(nodes=16, gpusPerNode=8, nccl="socket", persistence={"existingClaim": "ckpt"}),
    ),
}


def test_train_yaml_reads_back_as_the_config_given():
    cm = helm_render({"config": CONFIG})[0]
    assert load_yaml(cm["data"]["train.yaml"]) == CONFIG
    assert typed(load_yaml(cm["data"]["train.yaml"]))["training"]["learning_rate"] == ("float", 3e-05)


SEPARATORS = {
    "line-separator": "runs/a\u2028b",
    "paragraph-separator": "runs/out\u2029",
    "alone": "\u2028",
    "with-quotes-and-escapes": 'runs/it\'s "q" \\ <&>\u2029x',
    "with-a-newline": "runs/a\nb\u2028c",
}


@pytest.mark.parametrize("value", SEPARATORS.values(), ids=SEPARATORS.keys())
def test_a_config_with_unicode_line_separators_renders_exactly(value):
    """U+2028 and U+2029 are line breaks to a YAML 1.1 reader (PyYAML): written raw into the ConfigMap they
    would break it, or train.yaml; the rendered config reads back as the very value given, types included."""
    config = {**CONFIG, "output_dir": value, "tracking": {"run_name": value}}
    (cm,) = [o for o in helm_render({"config": config}) if o["kind"] == "ConfigMap"]  # the ConfigMap parses
    assert typed(load_yaml(cm["data"]["train.yaml"])) == typed(config)


BOTH_APIS = [
    pytest.param(api, cli_opts, values, id=f"{api}-{name}")
    for api in ("pytorchjob", "trainjob")
    for name, (cli_opts, values) in OPTION_SETS.items()
    if not (api == "trainjob" and "priority_class" in cli_opts)
] + [
    pytest.param(
        "trainjob",
        dict(nodes=2, runtime="my-torch", pvc="ckpt"),
        dict(nodes=2, runtime={"name": "my-torch"}, persistence={"existingClaim": "ckpt"}),
        id="trainjob-custom-runtime",
    ),
    pytest.param(
        "trainjob",
        dict(
            nodes=3,
            gpus_per_node=8,
            node_selector={"nvidia.com/gpu.product": "H200"},
            tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            queue="team-a",
            service_account="trainer",
            image_pull_secrets=["regcred"],
            pvc_size="1Ti",
            termination_grace=600,
        ),
        dict(
            nodes=3,
            gpusPerNode=8,
            scheduling={
                "nodeSelector": {"nvidia.com/gpu.product": "H200"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "queue": "team-a",
            },
            serviceAccount={"name": "trainer"},
            imagePullSecrets=["regcred"],
            persistence={"size": "1Ti"},
            terminationGracePeriodSeconds=600,
        ),
        id="trainjob-scheduling",
    ),
]


@pytest.mark.parametrize("api,cli_opts,values", BOTH_APIS)
def test_chart_equals_cli(api, cli_opts, values):
    spec = JobSpec(name="job", config_text=yaml.safe_dump(CONFIG), api=api, **cli_opts)
    from_cli = render(spec)
    from_helm = helm_render({**values, "config": CONFIG, "api": api})
    assert from_helm[-1]["kind"] == ("TrainJob" if api == "trainjob" else "PyTorchJob")
    validate_all(from_helm)
    assert normalise(from_helm) == normalise(from_cli)
    labels = from_helm[-1]["metadata"]["labels"]
    assert set(labels) - set(from_cli[-1]["metadata"]["labels"]) == HELM_ONLY_LABELS


def test_default_values_render_and_validate():
    objects = helm_render({}, name="colbert")
    assert [o["kind"] for o in objects] == ["ConfigMap", "PyTorchJob"]
    validate_all(objects)


def test_service_account_created_by_the_chart():
    objects = helm_render({"serviceAccount": {"create": True}})
    sa = next(o for o in objects if o["kind"] == "ServiceAccount")
    validate_all(objects)
    pod = objects[-1]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"] == "job"


BAD_VALUES = [
    ("unknown-top-key", {"gpus": 8}, "gpus"),
    ("ssh-key-in-env", {"env": {"SSH_PRIVATE_KEY": "x"}}, "SSH_PRIVATE_KEY"),
    ("pat-in-env", {"env": {"GITHUB_PAT": "x"}}, "GITHUB_PAT"),
    ("webhook-in-env", {"env": {"SLACK_WEBHOOK_URL": "x"}}, "SLACK_WEBHOOK_URL"),
    ("reserved-env", {"env": {"MASTER_ADDR": "x"}}, "MASTER_ADDR"),
    ("reserved-pet-env", {"env": {"PET_NNODES": "4"}}, "PET_NNODES"),
    ("reserved-secret-env", {"secretEnv": {"WORLD_SIZE": {"secret": "s", "key": "k"}}}, "WORLD_SIZE"),
    ("zero-shm", {"shm": {"enabled": True, "size": "0Gi"}}, "size"),
    ("del-in-env-value", {"env": {"A": "x\x7fy"}}, "env"),
    ("c1-in-annotation", {"annotations": {"example.com/a": "x\x85y"}}, "annotations"),
    ("label-key-injection", {"labels": {"a: b\nkind: Secret": "x"}}, "invalid propertyName 'a: b"),
    ("annotation-key-injection", {"annotations": {"x\n---\nkind: Secret": "y"}}, "invalid propertyName 'x"),
    ("node-selector-key", {"scheduling": {"nodeSelector": {"a b": "c"}}}, "invalid propertyName 'a b'"),
    ("toleration-shape", {"scheduling": {"tolerations": [{"key": "k", "effect": "Sometimes"}]}}, "effect"),
    ("trailing-newline-name", {"imagePullSecrets": ["regcred\n"]}, "imagePullSecrets"),
    ("config-trainer-refuses", {"config": {**CONFIG, "training": {"learning_rate": 2.0}}}, "learning_rate"),
    ("bad-nodes", {"nodes": 0}, "nodes"),
    ("bad-config-key", {"config": {**CONFIG, "training": {"per_device_batchsize": 4}}}, "per_device_batchsize"),
    ("token-in-env", {"env": {"HF_TOKEN": "hf_x"}}, "HF_TOKEN"),
    ("bad-quantity", {"resources": {"memory": "lots"}}, "memory"),
    ("bad-nccl", {"nccl": "rdma"}, "nccl"),
]


@pytest.mark.parametrize("name,values,needle", BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_bad_values_are_rejected_by_the_schema(name, values, needle):
    with pytest.raises(helm_python.HelmValuesError) as e:
        helm_render(values)
    assert needle in str(e.value)


KEYS = [
    "team",
    "example.com/team",
    "a.b-c.example/x_y.z",
    "A9",
    "x" * 63,
    "x" * 64,
    "example.com/",
    "Example.com/team",
    "-team",
    "team-",
    "a b",
    "team: x",
    'team"\nkind: Secret',
    "a/b/c",
    "{{ .Release.Name }}",
]


@pytest.mark.parametrize("key", KEYS)
def test_the_chart_guards_keys_like_the_cli_when_the_schema_is_skipped(tmp_path, key):
    """The template guard behind the schema (``colbert-train.key``) takes exactly the keys the CLI takes
    (``rules.full("qualified_name", ...)``), and a key it takes cannot change the YAML's structure."""
    from operator_cli import rules

    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    (chart / "values.schema.json").unlink()  # as `helm install --skip-schema-validation` would
    values = {"config": CONFIG, "annotations": {key: "v"}}
    if rules.full("qualified_name", key):
        with helm_python.Chart.load(str(chart)) as loaded:
            out = loaded.render(values=values, name="job", namespace="default")
        configmap = next(yaml.safe_load(text) for path, text in out.items() if path.endswith("/configmap.yaml"))
        assert configmap["kind"] == "ConfigMap" and configmap["metadata"]["annotations"] == {key: "v"}
    else:
        with pytest.raises(helm_python.HelmError) as e, helm_python.Chart.load(str(chart)) as loaded:
            loaded.render(values=values, name="job", namespace="default")
        assert "is not a valid qualified name" in str(e.value)


def test_trainjob_refuses_a_priority_class_like_the_cli():
    with pytest.raises(helm_python.HelmError) as e:
        helm_render({"api": "trainjob", "scheduling": {"priorityClassName": "high"}})
    assert "priorityClassName cannot be set on a TrainJob" in str(e.value)


def test_multi_node_without_storage_fails_like_the_cli():
    with pytest.raises(helm_python.HelmError) as e:
        helm_render({"nodes": 2})
    assert "nodes 2 without shared storage" in str(e.value) and "persistence.podLocal" in str(e.value)


def test_bad_release_name_fails_with_a_clear_message():
    with pytest.raises(helm_python.HelmError) as e:
        helm_render({}, name="x" * 60, namespace="default")
    assert "would exceed 63 characters" in str(e.value) or "too long" in str(e.value)


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_release_name_length_follows_the_cli_for_both_apis(api):
    """11 nodes, a 54-character name: the longest PyTorchJob pod (-worker-9) fits in 63 characters,
    JobSet's (-node-0-10) does not. The chart and the CLI draw the line in the same place."""
    from operator_cli.errors import CliError
    from operator_cli.spec import JobSpec

    name = "a" * 54
    values = {"api": api, "nodes": 11, "gpusPerNode": 0, "persistence": {"podLocal": True}}
    try:
        JobSpec(
            name=name, config_text=yaml.safe_dump(CONFIG), nodes=11, gpus_per_node=0, api=api, pod_local_storage=True
        )
        cli_refuses = False
    except CliError as e:
        cli_refuses, cli_message = True, str(e)
    if cli_refuses:
        with pytest.raises(helm_python.HelmError) as e:
            helm_render(values, name=name)
        assert "would exceed 63 characters" in str(e.value) and "would exceed 63 characters" in cli_message
    else:
        assert helm_render(values, name=name)
    assert cli_refuses == (api == "trainjob")


BIG = {**CONFIG, "tracking": {"run_name": "x" * 200}, "model": {"name_or_path": "m/" + "x" * (2 << 20)}}
WITH_C1 = {**CONFIG, "data": {"train": {"path": "data/tr\x85ain.jsonl"}}}


@pytest.mark.parametrize(
    "values,needle",
    [
        ({"labels": {"app.kubernetes.io/managed-by": "me"}}, "labels"),
        ({"runPolicy": {"backoffLimit": 10**12}}, "backoffLimit"),
        ({"config": {"training": {"max_steps": 10}}}, "data"),
        ({"config": {**CONFIG, "training": {"epochs": None}}}, "config"),
        ({"config": {**CONFIG, "evaluation": {"before_training": True}}}, "config"),
        ({"config": {**CONFIG, "evaluation": {"every_steps": 10}}}, "config"),
        ({"config": {**CONFIG, "mine": {"retriever": "bm25", "model": "m"}}}, "config"),
        ({"config": BIG}, "a ConfigMap holds at most 1048576"),
        ({"config": WITH_C1}, "control character"),
        ({"config": {**CONFIG, "data": {"train": {"path": "a\x7fb"}}}}, "control character"),
        ({"config": {**CONFIG, "data": {"train": {"path": "a\x01b"}}}}, "control character"),
        ({"config": {**CONFIG, "data": {"train": {"path": "a\ufffeb"}}}}, "control character"),
        ({"annotations": {"example.com/note": "hf_SeCrEtVaLuE1234567890"}}, "annotations"),
        ({"env": {"MODEL_REVISION": "ghp_" + "a1" * 18}}, "env"),
        ({"config": {**CONFIG, "model": {"name_or_path": "https://u:p4ss@example.com/m"}}}, "name_or_path"),
        ({"config": {**CONFIG, "data": {"train": {"path": "https://a.blob.core.windows.net/c/t?sv=1&sig=x"}}}}, "path"),
        ({"env": {"AZURE_SAS": "sv=2022-11-02&ss=b&X-Amz-Security-Token=FwoG"}}, "env"),
        ({"resources": {"memory": "4Gi"}}, "shm.size 8Gi would fill resources.memory 4Gi"),
    ],
    ids=[
        "label-overrides-managed-by",
        "backoff-past-int32",
        "config-without-data",
        "neither-epochs-nor-max-steps",
        "before-training-without-eval-data",
        "every-steps-without-eval-data",
        "mine-model-with-bm25",
        "config-over-1-mib",
        "c1-in-config",
        "del-in-config",
        "c0-in-config",
        "u+fffe-in-config",
        "token-in-an-annotation",
        "token-in-a-plain-env-value",
        "password-in-a-config-url",
        "sas-signature-in-a-config-url",
        "session-token-in-an-env-value",
        "shm-fills-memory",
    ],
)
def test_chart_refuses_what_the_cli_refuses(values, needle, tmp_path):
    """Issue 21's leftovers: values the CLI refuses fail the chart too (its schema or its templates)."""
    with pytest.raises(helm_python.HelmError) as e:
        helm_render(values)
    assert needle in str(e.value)
    if "config" in values and "\\u0001" not in json.dumps(values["config"]):
        # the CLI refuses the same config, written as a file with its characters as they are (an escaped
        # C0 character is a YAML escape the CLI accepts; the chart refuses it too, being stricter there)
        from trainer.config.load import load_config
        from trainer.config.schema import ConfigError

        path = tmp_path / "train.yaml"
        path.write_text(json.dumps(values["config"], ensure_ascii=False), encoding="utf-8")
        with pytest.raises(ConfigError):
            load_config(path)


def test_a_config_just_under_the_limit_and_with_tabs_is_accepted():
    ok = {**CONFIG, "tracking": {"run_name": "tab\there"}, "model": {"name_or_path": "m/" + "x" * 1_000_000}}
    assert helm_render({"config": ok})


ELASTIC_CONFIG = {**CONFIG, "training": {**CONFIG["training"], "global_batch_size": 24, "per_device_batch_size": 4}}


def test_elastic_chart_equals_cli():
    spec = JobSpec(
        name="job", config_text=yaml.safe_dump(ELASTIC_CONFIG), nodes=3, gpus_per_node=2, pvc="ckpt", elastic=(2, 4)
    )
    from_helm = helm_render(
        {
            "nodes": 3,
            "gpusPerNode": 2,
            "persistence": {"existingClaim": "ckpt"},
            "elastic": "2:4",
            "config": ELASTIC_CONFIG,
        }
    )
    validate_all(from_helm)
    assert "elasticPolicy" in from_helm[-1]["spec"]
    assert normalise(from_helm) == normalise(render(spec))


ELASTIC_VALUES = {
    "nodes": 4,
    "gpusPerNode": 2,
    "persistence": {"size": "1Gi"},
    "elastic": "2:4",
    "config": ELASTIC_CONFIG,
}


@pytest.mark.parametrize(
    "over,needle,cli",
    [
        ({"api": "trainjob"}, "a TrainJob (Kubeflow Trainer v2.3.0) has no elastic policy", {"api": "trainjob"}),
        ({"persistence": {"podLocal": True}}, "needs shared storage", {"pvc_size": None, "pod_local_storage": True}),
        ({"nodes": 5}, "must be within 2..4", {"nodes": 5}),
        ({"config": CONFIG}, "needs config.training.global_batch_size", {"config_text": yaml.safe_dump(CONFIG)}),
        (
            {"gpusPerNode": 3},
            "3 node(s) x 3 process(es): training.global_batch_size 24 cannot be split over 9",
            {"gpus_per_node": 3},
        ),
        ({"elastic": "4:2"}, "1 <= MIN <= MAX <= 1024", {"elastic": (4, 2)}),
        ({"elastic": "two"}, "elastic", None),
    ],
    ids=[
        "trainjob",
        "per-pod-storage",
        "nodes-outside",
        "no-global-batch",
        "does-not-split",
        "backwards",
        "not-min-max",
    ],
)
def test_elastic_chart_refuses_what_the_cli_refuses(over, needle, cli):
    with pytest.raises(helm_python.HelmError) as e:
        helm_render({**ELASTIC_VALUES, **over})
    assert needle in str(e.value), str(e.value)
    if cli is not None:
        from operator_cli.errors import CliError

        base = dict(
            name="job",
            config_text=yaml.safe_dump(ELASTIC_CONFIG),
            nodes=4,
            gpus_per_node=2,
            pvc_size="1Gi",
            elastic=(2, 4),
        )
        with pytest.raises(CliError):
            JobSpec(**{**base, **cli})
