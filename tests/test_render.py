"""Rendered manifests: the real CRD schema, Kubernetes' own schemas, hostile values, names, security."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from operator_cli.errors import CliError
from operator_cli.render import render, to_yaml
from operator_cli.spec import JobSpec, SecretRef
from tests.helpers import ROOT
from tests.helpers.schemas import validate_all, validate_pytorchjob

CONFIG = "data:\n  train: {path: data/train.jsonl}\n"

MATRIX = {
    "cpu-single": dict(nodes=1, gpus_per_node=0),
    "cpu-two-nodes": dict(nodes=2, gpus_per_node=0, shm_size=None, pod_local_storage=True, termination_grace=0),
    "one-gpu": dict(nodes=1, gpus_per_node=1),
    "2x8-gpu-ib": dict(nodes=2, gpus_per_node=8, nccl="ib", cpu="32", memory="256Gi", pvc_size="1Ti"),
    "16-nodes-socket": dict(nodes=16, gpus_per_node=4, nccl="socket", pvc="ckpt"),
    "existing-pvc": dict(nodes=2, gpus_per_node=2, pvc="shared-data"),
    "new-pvc": dict(nodes=3, gpus_per_node=1, pvc_size="500Gi", storage_class="fast-rwx"),
    "scheduling": dict(
        nodes=2,
        gpus_per_node=8,
        node_selector={"nvidia.com/gpu.product": "H100"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        priority_class="high",
        queue="team-a",
        service_account="trainer",
        pod_local_storage=True,
    ),
    "pull-secrets": dict(image="reg.example.com/ml/colbert-train:1.2", image_pull_secrets=["regcred", "other"]),
    "env-and-secrets": dict(
        env={"WANDB_MODE": "offline", "LOG_LEVEL": "debug"},
        secret_env={"HF_TOKEN": SecretRef("hf", "token"), "WANDB_API_KEY": SecretRef("wandb", "key")},
    ),
    "lifetime": dict(backoff_limit=0, active_deadline=None, ttl_after_finished=0),
    "metadata": dict(
        labels={"team": "search", "example.com/cost-center": "42"},
        annotations={"example.com/owner": "alice@example.com", "note": "a: b"},
    ),
    "namespace": dict(namespace="ml-training", nodes=4, gpus_per_node=8, pvc="ckpt"),
}


def _spec(**kw) -> JobSpec:
    return JobSpec(**{"name": "job", "config_text": CONFIG, **kw})


@pytest.mark.parametrize("opts", MATRIX.values(), ids=MATRIX.keys())
def test_matrix_passes_crd_and_core_schemas(opts):
    objects = render(_spec(**opts))
    validate_all(objects)
    job = objects[-1]
    spec = _spec(**opts)
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1
    assert replicas.get("Worker", {}).get("replicas", 0) == spec.nodes - 1
    assert job["spec"]["nprocPerNode"] == str(max(1, spec.gpus_per_node))
    for r in replicas.values():
        pod = r["template"]["spec"]
        (container,) = pod["containers"]
        assert container["name"] == "pytorch"
        per_pod = spec.nodes > 1 and not spec.claim_name  # JobSpec.restart_policy
        assert r["restartPolicy"] == ("OnFailure" if per_pod else "ExitCode")
        assert container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0) == spec.gpus_per_node
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"], **({"add": ["IPC_LOCK"]} if spec.nccl == "ib" else {})},
        }
        assert r["template"]["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "job" and labels["app.kubernetes.io/managed-by"] == "colbert-k8s"
        assert {"app.kubernetes.io/name", "app.kubernetes.io/component"} <= labels.keys()
        _assert_no_empty(obj)


def _assert_no_empty(node, path="") -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "emptyDir":
                continue  # `emptyDir: {}` is how Kubernetes spells "a plain scratch volume"
            assert v is not None and v != {} and v != [] and v != "", f"empty field at {path}/{k}"
            _assert_no_empty(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _assert_no_empty(v, f"{path}[{i}]")


def test_secret_values_never_rendered():
    objects = render(_spec(secret_env={"HF_TOKEN": SecretRef("hf-secret", "token")}))
    env = objects[-1]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]
    hf = next(e for e in env if e["name"] == "HF_TOKEN")
    assert hf == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-secret", "key": "token"}}}


HOSTILE = [
    "quote \" and ' here",
    "newline\nkind: Secret\n---\napiVersion: v1",
    "{{ spec.name }} {% if true %}x{% endif %}",
    "colon: value, - dash: [list] {map: 1} # comment",
    "unicode ü 日本語 \u2028 emoji 🚀",
    "&anchor *alias !!python/object:os.system",
]


@pytest.mark.parametrize(
    "value", HOSTILE, ids=["quotes", "newline-doc", "jinja", "yaml-syntax", "unicode", "yaml-tags"]
)
def test_hostile_values_cannot_change_structure(value):
    spec = _spec(
        nodes=2,
        pod_local_storage=True,
        env={"USER_VALUE": value},
        annotations={"example.com/note": value},
        config_text=CONFIG + f"# {value!r}\n",
    )
    objects = render(spec)
    text = to_yaml(objects)
    reparsed = list(yaml.safe_load_all(text))
    assert reparsed == objects
    assert [o["kind"] for o in reparsed] == ["ConfigMap", "PyTorchJob"]
    container = reparsed[-1]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert {"name": "USER_VALUE", "value": value} in container["env"]
    assert reparsed[-1]["metadata"]["annotations"]["example.com/note"] == value
    assert reparsed[0]["data"]["train.yaml"] == spec.config_text
    validate_pytorchjob(reparsed[-1])


BAD_SPECS = [
    ("upper-name", dict(name="MyJob"), "--name must be a DNS-1035 label"),
    ("digit-start", dict(name="1job"), "--name must be a DNS-1035 label"),
    ("too-long-for-workers", dict(name="a" * 55, nodes=12, pvc="ws"), "would exceed 63 characters"),
    ("multi-node-no-storage", dict(nodes=2), "--nodes 2 without shared storage"),
    ("pod-local-and-pvc", dict(nodes=2, pvc="ws", pod_local_storage=True), "--pod-local-storage excludes"),
    ("negative-grace", dict(termination_grace=-1), "--termination-grace-period must be"),
    ("zero-nodes", dict(nodes=0), "--nodes must be between 1 and 1024"),
    ("bad-quantity", dict(memory="lots"), "--memory must be a Kubernetes quantity"),
    ("pvc-both", dict(pvc="a", pvc_size="1Gi"), "--pvc and --pvc-size exclude each other"),
    ("reserved-env", dict(env={"WORLD_SIZE": "4"}), "--env WORLD_SIZE is set by the Training Operator"),
    ("token-in-env", dict(env={"HF_TOKEN": "hf_abc123"}), "looks like a credential"),
    ("bad-label", dict(labels={"team": "has spaces"}), "--label value for team"),
    ("nccl-cpu", dict(gpus_per_node=0, nccl="ib"), "--nccl applies to GPU jobs only"),
]


@pytest.mark.parametrize("name,kw,message", BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_bad_options_are_refused(name, kw, message):
    from operator_cli.errors import CliError

    with pytest.raises(CliError) as e:
        _spec(**kw)
    assert message in e.value.message
    assert "hf_abc123" not in e.value.message + (e.value.hint or "")


ELASTIC_CONFIG = CONFIG + "training: {global_batch_size: 24, per_device_batch_size: 4}\n"


def test_elastic_renders_workers_only_with_an_elastic_policy():
    """What the Training Operator v1.9.4 needs for torchrun's agents: Workers only (its rendezvous endpoint is
    <job>-worker-0), elasticPolicy with c10d, and PET_NPROC_PER_NODE, which it injects only with a Master."""
    from operator_cli.kube.kinds import plan_pods

    objects = render(_spec(config_text=ELASTIC_CONFIG, elastic=(2, 4), nodes=3, gpus_per_node=2, pvc="ws"))
    validate_all(objects)
    job = objects[-1]["spec"]
    assert list(job["pytorchReplicaSpecs"]) == ["Worker"] and job["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    assert job["elasticPolicy"] == {"minReplicas": 2, "maxReplicas": 4, "rdzvBackend": "c10d", "maxRestarts": 3}
    env = job["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "PET_NPROC_PER_NODE", "value": "2"} in env
    plan = plan_pods(objects)
    assert plan.hosts == ["job-worker-0", "job-worker-1", "job-worker-2"] and plan.elastic == (2, 4)
    pod = plan.launcher_env(1, "job-worker-0", 23456)
    assert pod["PET_RDZV_ENDPOINT"] == "job-worker-0:23456" and pod["PET_NNODES"] == "2:4"
    assert not {"MASTER_ADDR", "RANK", "WORLD_SIZE", "PET_NODE_RANK"} & set(pod)


ELASTIC_BAD = [
    ("trainjob", dict(api="trainjob"), "a TrainJob (Kubeflow Trainer v2.3.0) has no elastic policy"),
    ("no-claim", dict(pvc=None, pod_local_storage=True), "needs shared storage"),
    ("nodes-outside", dict(nodes=5), "--nodes 5 (the pods asked for at start) must be within 2..4"),
    ("no-global-batch", dict(config_text=CONFIG), "needs training.global_batch_size"),
    (
        "world-size-that-does-not-split",  # 24 over 3 nodes x 3 processes = 9
        dict(gpus_per_node=3),
        "3 node(s) x 3 process(es): training.global_batch_size 24 cannot be split over 9 processes; world sizes "
        "that work: 1, 2, 3, 4, 6, 8, 12, 24",
    ),
]


@pytest.mark.parametrize("name,kw,message", ELASTIC_BAD, ids=[c[0] for c in ELASTIC_BAD])
def test_elastic_refusals(name, kw, message):
    base = dict(config_text=ELASTIC_CONFIG, elastic=(2, 4), nodes=4, gpus_per_node=2, pvc="ws")
    with pytest.raises(CliError) as e:
        _spec(**{**base, **kw})
    assert message in e.value.message, e.value.message


@pytest.mark.parametrize(
    "raw,message",
    [
        ("3", "--elastic must be MIN:MAX"),
        ("a:b", "--elastic must be MIN:MAX"),
        ("4:2", "1 <= MIN <= MAX <= 1024"),
        ("0:2", "1 <= MIN <= MAX"),
        ("1:2000", "MAX <= 1024"),
    ],
)
def test_elastic_flag_is_min_colon_max(raw, message):
    from operator_cli.spec import parse_elastic

    assert parse_elastic("1:4") == (1, 4)
    with pytest.raises(CliError, match=message):
        parse_elastic(raw)


def test_longest_allowed_name_fits():
    name = "a" * (63 - len("-worker-10"))
    objects = render(_spec(name=name, nodes=12, pvc="ws"))
    assert objects[-1]["metadata"]["name"] == name


def test_golden_dry_run(tmp_path):
    """The full `submit --dry-run` output for one option set, compared with the reviewed golden file."""
    cfg = tmp_path / "train.yaml"
    cfg.write_text(CONFIG)
    args = [
        "--config",
        str(cfg),
        "--name",
        "golden",
        "--nodes",
        "2",
        "--gpus-per-node",
        "4",
        "--nccl",
        "socket",
        "--pvc-size",
        "50Gi",
        "--secret-env",
        "HF_TOKEN=hf/token",
        "--env",
        "WANDB_MODE=offline",
        "--memory",
        "64Gi",
        "--queue",
        "research",
    ]
    rendered = subprocess.run(
        [sys.executable, "-m", "operator_cli.cli", "render", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout
    dry = subprocess.run(
        [sys.executable, "-m", "operator_cli.cli", "submit", "--dry-run", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout
    assert dry == rendered
    golden = ROOT / "tests" / "golden" / "dry_run.yaml"
    assert rendered == golden.read_text()


# ---- Kubeflow Trainer v2: the same options as a TrainJob ----------------------------------------------

TRAINJOB_MATRIX = {name: {k: v for k, v in opts.items() if k != "priority_class"} for name, opts in MATRIX.items()} | {
    "custom-runtime": dict(nodes=4, gpus_per_node=8, runtime="torch-distributed-ib", pvc="ckpt", nccl="ib"),
    "custom-runtime-cpu": dict(nodes=2, gpus_per_node=0, runtime="cpu-runtime", pod_local_storage=True),
}


@pytest.mark.parametrize("opts", TRAINJOB_MATRIX.values(), ids=TRAINJOB_MATRIX.keys())
def test_trainjob_matrix_passes_v2_schemas(opts):
    spec = _spec(api="trainjob", **opts)
    objects = render(spec)
    validate_all(objects)
    job = objects[-1]
    assert job["kind"] == "TrainJob" and job["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert job["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": spec.runtime,
    }
    trainer = job["spec"]["trainer"]
    assert trainer["numNodes"] == spec.nodes and trainer["numProcPerNode"] == spec.nproc_per_node
    assert trainer["command"] == ["colbert-train"] and trainer["args"] == ["--config", "/etc/colbert-k8s/train.yaml"]
    (patch,) = job["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]
    assert pod["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "colbert-k8s"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["terminationGracePeriodSeconds"] == spec.termination_grace
    (container,) = pod["spec"]["containers"]
    ipc_lock = {"add": ["IPC_LOCK"]} if spec.nccl == "ib" else {}  # InfiniBand pins memory (issue 43)
    assert container["name"] == "node" and container["securityContext"]["capabilities"] == {"drop": ["ALL"], **ipc_lock}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == f"{spec.name}-config"
    if spec.claim_name:
        assert volumes["workspace"]["persistentVolumeClaim"]["claimName"] == spec.claim_name
    else:
        assert volumes["workspace"] == {"name": "workspace", "emptyDir": {}}
    assert ("dshm" in volumes) == bool(spec.shm_size)
    env = {e["name"]: e for e in trainer["env"]}
    for var, ref in spec.secret_env.items():
        assert env[var]["valueFrom"]["secretKeyRef"] == {"name": ref.secret, "key": ref.key}
    if spec.queue:
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == spec.queue
    if spec.image_pull_secrets:
        assert pod["spec"]["imagePullSecrets"] == [{"name": s} for s in spec.image_pull_secrets]
    if spec.gpus_per_node:
        assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == spec.gpus_per_node


def test_trainjob_dry_run_is_byte_identical_and_names_pods(tmp_path):
    cfg = tmp_path / "train.yaml"
    cfg.write_text(CONFIG)
    args = ["--config", str(cfg), "--name", "v2", "--api", "trainjob", "--nodes", "3", "--pvc-size", "9Gi"]
    run = lambda *a: (
        subprocess.run(  # noqa: E731
            [sys.executable, "-m", "operator_cli.cli", *a, *args], capture_output=True, text=True, cwd=ROOT, check=True
        ).stdout
    )
    assert run("render") == run("submit", "--dry-run")
    assert "kind: TrainJob" in run("render") and "kind: PyTorchJob" not in run("render")


def test_trainjob_refuses_what_v2_cannot_set():
    with pytest.raises(CliError) as e:
        _spec(api="trainjob", priority_class="high")
    assert "--priority-class cannot be set on a TrainJob" in e.value.message
    with pytest.raises(CliError):
        _spec(api="mpijob")
