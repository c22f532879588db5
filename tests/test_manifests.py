"""Manifests a platform team accepts (issue 43, item 4): CPU and memory requests on every pod, /dev/shm counted
against the memory, InfiniBand's device and capability, the version label, a name that does not change from
one render to the next, and the note on a claim of the default StorageClass."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from operator_cli import __version__
from operator_cli.cli import cli
from operator_cli.errors import CliError
from operator_cli.kube.kinds import kind_of
from operator_cli.render import render
from operator_cli.spec import JobSpec
from tests.helpers import ROOT
from tests.helpers.schemas import validate_all

CONFIG = "data:\n  train: {path: s3://bucket/train.jsonl}\n"


def _containers(job: dict) -> tuple[dict, dict]:
    """(resources, securityContext) of the trainer container, for either kind."""
    if job["kind"] == "TrainJob":
        patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        (container,) = patch["template"]["spec"]["template"]["spec"]["containers"]
        return job["spec"]["trainer"]["resourcesPerNode"], container["securityContext"]
    (container,) = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    return container["resources"], container["securityContext"]


RESOURCES = [
    ("8-gpus-derived", dict(gpus_per_node=8), {"nvidia.com/gpu": 8}, {"cpu": "32", "memory": "136Gi"}),
    ("cpu-job-derived", dict(gpus_per_node=0), None, {"cpu": "4", "memory": "16Gi"}),
    ("no-shm", dict(gpus_per_node=1, shm_size=None), {"nvidia.com/gpu": 1}, {"cpu": "4", "memory": "16Gi"}),
    ("odd-shm-in-mi", dict(gpus_per_node=1, shm_size="1G"), {"nvidia.com/gpu": 1}, {"cpu": "4", "memory": "17338Mi"}),
    (
        "given-wins",
        dict(gpus_per_node=2, cpu="6", memory="40Gi"),
        {"nvidia.com/gpu": 2, "cpu": "6", "memory": "40Gi"},
        {"cpu": "6", "memory": "40Gi"},
    ),
    (
        "ib-device",
        dict(gpus_per_node=8, nccl="ib"),
        {"nvidia.com/gpu": 8, "rdma/ib": 1},
        {"cpu": "32", "memory": "136Gi"},
    ),
    (
        "ib-other-plugin",
        dict(gpus_per_node=8, nccl="ib", rdma_resource="nvidia.com/hostdev"),
        {"nvidia.com/gpu": 8, "nvidia.com/hostdev": 1},
        {"cpu": "32", "memory": "136Gi"},
    ),
    (
        "ib-no-device",
        dict(gpus_per_node=8, nccl="ib", rdma_resource=None),
        {"nvidia.com/gpu": 8},
        {"cpu": "32", "memory": "136Gi"},
    ),
    ("socket-no-device", dict(gpus_per_node=8, nccl="socket"), {"nvidia.com/gpu": 8}, {"cpu": "32", "memory": "136Gi"}),
]


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize("opts,limits,requests", [r[1:] for r in RESOURCES], ids=[r[0] for r in RESOURCES])
def test_every_pod_requests_cpu_and_memory(api, opts, limits, requests):
    """A quota on requests.cpu/requests.memory admits the pod, and the scheduler places it by what it needs."""
    objects = render(JobSpec(name="job", config_text=CONFIG, api=api, **opts))
    validate_all(objects)
    resources, security = _containers(objects[-1])
    assert resources.get("limits") == limits and resources["requests"] == requests
    ib = opts.get("nccl") == "ib"
    assert security["capabilities"] == {"drop": ["ALL"], **({"add": ["IPC_LOCK"]} if ib else {})}


@pytest.mark.parametrize(
    "opts,message",
    [
        (dict(memory="4Gi"), "--shm-size 8Gi would fill --memory 4Gi: /dev/shm is memory-backed"),
        (dict(memory="8Gi"), "--shm-size 8Gi would fill --memory 8Gi"),
        (dict(memory="2G", shm_size="2Gi"), "--shm-size 2Gi would fill --memory 2G"),
        (dict(nccl="ib", rdma_resource="not a name"), "--rdma-resource must be an extended resource name"),
    ],
    ids=["shm-over-memory", "shm-equals-memory", "binary-over-decimal", "bad-rdma-name"],
)
def test_refused_in_one_line(opts, message):
    with pytest.raises(CliError) as e:
        JobSpec(name="job", config_text=CONFIG, **opts)
    assert message in e.value.message and "\n" not in e.value.message


def test_shm_just_under_memory_is_accepted():
    JobSpec(name="job", config_text=CONFIG, memory="8193Mi")


def test_version_label_on_every_object_and_pod_and_not_settable():
    objects = render(JobSpec(name="job", config_text=CONFIG, pvc_size="1Gi"))
    pod = objects[-1]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    for meta in [o["metadata"] for o in objects] + [pod["metadata"]]:
        assert meta["labels"]["app.kubernetes.io/version"] == __version__
    chart = yaml.safe_load((ROOT / "charts" / "colbert-train" / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__  # the chart labels with its appVersion: the same value
    with pytest.raises(CliError) as e:
        JobSpec(name="job", config_text=CONFIG, labels={"app.kubernetes.io/version": "9"})
    assert "is set by colbert-k8s itself" in e.value.message


def _render(tmp_path, *args: str):
    cfg = tmp_path / "train.yaml"
    if not cfg.exists():
        cfg.write_text(CONFIG)
    return CliRunner().invoke(cli, ["render", "--config", str(cfg), *args], catch_exceptions=False)


def test_default_name_is_stable_and_follows_the_job(tmp_path):
    """Two renders of one job are the same bytes (a file kept in git does not change); another option or
    another config is another name."""
    first, again = _render(tmp_path), _render(tmp_path)
    assert first.exit_code == 0, first.output
    assert first.stdout == again.stdout
    name = yaml.safe_load_all(first.stdout).__next__()["metadata"]["labels"]["app.kubernetes.io/instance"]
    assert name.startswith("colbert-") and len(name) == len("colbert-") + 8
    other = _render(tmp_path, "--nodes", "2", "--pod-local-storage")
    assert name not in other.stdout
    (tmp_path / "train.yaml").write_text(CONFIG + "training: {max_steps: 5}\n")
    assert name not in _render(tmp_path).stdout
    assert "name: other" in _render(tmp_path, "--name", "other").stdout


@pytest.mark.parametrize(
    "opts,policy,permanent",
    [
        (dict(), "ExitCode", True),  # one pod on its emptyDir: 0.3 retried a bad data path backoffLimit times
        (dict(pvc_size="1Gi"), "ExitCode", True),
        (dict(nodes=2, pvc="ws"), "ExitCode", True),
        (dict(nodes=2, pod_local_storage=True), "OnFailure", False),  # the master's pod keeps the checkpoints
    ],
    ids=["one-pod-empty-dir", "one-pod-claim", "two-pods-claim", "two-pods-pod-local"],
)
def test_a_permanent_exit_fails_at_once_but_on_pod_local_storage(opts, policy, permanent):
    """Issue 43, item 6: the policy local replays is read back from the rendered job (PodPlan)."""
    job = render(JobSpec(name="job", config_text=CONFIG, gpus_per_node=0, **opts))
    failure = kind_of(job[-1]).plan(job[-1], job).failure
    replicas = job[-1]["spec"]["pytorchReplicaSpecs"].values()
    assert {r["restartPolicy"] for r in replicas} == {policy}
    assert failure.is_permanent(2) is permanent and failure.is_permanent(1) is permanent
    assert not failure.is_permanent(129) and not failure.is_permanent(-9)
    assert failure.recreates_pods is (policy == "ExitCode")  # a new pod: its emptyDir starts empty
