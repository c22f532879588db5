"""`colbert-k8s resize` against the emulator, for both kinds: the job is recreated with the new shape, its
storage and ConfigMap kept (re-owned by the new job); bad shapes, per-pod storage and a missing job are one line."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from operator_cli.cli import cli
from tests.helpers.kube_emulator import Emulator
from tests.helpers.runtimes import TORCH_RUNTIME

ELASTIC = "data:\n  train: {path: data/train.jsonl}\ntraining: {global_batch_size: 32}\n"
FIXED = "data:\n  train: {path: data/train.jsonl}\n"


def run(emu, *args):
    return CliRunner().invoke(cli, [*args, "--kubeconfig", str(emu.kubeconfig)])


@pytest.fixture(params=["pytorchjob", "trainjob"])
def api(request, tmp_path):
    with Emulator(tmp_path, with_crd=True, with_v2=True, runtimes=(TORCH_RUNTIME,)) as emu:
        emu.api_name = request.param
        yield emu


def _submit(emu, tmp_path, text: str, *storage: str):
    cfg = tmp_path / "train.yaml"
    cfg.write_text(text)
    res = run(
        emu,
        "submit",
        "--config",
        str(cfg),
        "--name",
        "demo",
        "--nodes",
        "2",
        "--gpus-per-node",
        "0",
        "--api",
        emu.api_name,
        *(storage or ("--pvc-size", "10Gi")),
    )
    assert res.exit_code == 0, res.output
    plural = "pytorchjobs" if emu.api_name == "pytorchjob" else "trainjobs"
    return plural


def _job(emu, plural):
    (job,) = emu.objects(plural)
    return job


def test_resize_recreates_the_job_with_the_new_shape_and_keeps_storage(api, tmp_path):
    plural = _submit(api, tmp_path, ELASTIC)
    old_uid = _job(api, plural)["metadata"]["uid"]
    res = run(api, "resize", "demo", "--nodes", "4")
    assert res.exit_code == 0, res.output
    assert "resized" in res.output and "to 4 node(s)" in res.output
    job = _job(api, plural)
    assert job["metadata"]["uid"] != old_uid  # a new object
    if plural == "pytorchjobs":
        assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
        assert (
            job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["labels"][
                "app.kubernetes.io/component"
            ]
            == "worker"
        )  # noqa: E501
    else:
        assert job["spec"]["trainer"]["numNodes"] == 4
    (cm,) = api.objects("configmaps")
    assert [o["uid"] for o in cm["metadata"]["ownerReferences"]] == [job["metadata"]["uid"]]  # re-owned
    assert [p["metadata"]["name"] for p in api.objects("persistentvolumeclaims")] == ["demo-workspace"]
    assert "status" not in job or not job["status"]


def test_more_gpus_per_node(api, tmp_path):
    plural = _submit(api, tmp_path, ELASTIC)
    assert run(api, "resize", "demo", "--nodes", "2", "--gpus-per-node", "2").exit_code == 0
    job = _job(api, plural)
    if plural == "pytorchjobs":
        assert job["spec"]["nprocPerNode"] == "2"
        limits = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resources"][
            "limits"
        ]
    else:
        assert job["spec"]["trainer"]["numProcPerNode"] == 2
        limits = job["spec"]["trainer"]["resourcesPerNode"]["limits"]
    assert limits["nvidia.com/gpu"] == 2


@pytest.mark.parametrize(
    "text,storage,args,needle",
    [
        (ELASTIC, ("--pod-local-storage",), ("--nodes", "3"), "keeps its checkpoints in each pod's emptyDir"),
        (ELASTIC, (), ("--nodes", "3"), "cannot be split over 3 processes; world sizes that work: 1, 2, 4, 8, 16, 32"),
        (FIXED, (), ("--nodes", "4"), "does not set training.global_batch_size"),
    ],
    ids=["per-pod-storage", "shape-cannot-hold-the-batch", "not-elastic"],
)
def test_refusals_are_one_line_and_touch_nothing(api, tmp_path, text, storage, args, needle):
    plural = _submit(api, tmp_path, text, *storage)
    before = _job(api, plural)
    res = run(api, "resize", "demo", *args)
    assert res.exit_code == 2 and res.output.count("error:") == 1 and needle in res.output, res.output
    assert _job(api, plural) == before  # not deleted, not changed
    assert api.objects("configmaps")[0]["metadata"].get("ownerReferences")


def test_a_job_that_does_not_exist(api):
    res = run(api, "resize", "ghost", "--nodes", "2")
    assert res.exit_code == 1 and "not found" in res.output and res.output.count("error:") == 1


def test_an_elastic_job_is_resized_within_its_range_only(tmp_path):
    """An elastic PyTorchJob has Workers only: resize sets their count (and the manifest's PET_NPROC_PER_NODE)
    within MIN..MAX, and refuses a count outside it before touching anything."""
    with Emulator(tmp_path, with_crd=True) as emu:
        cfg = tmp_path / "train.yaml"
        cfg.write_text(ELASTIC)
        res = run(
            emu,
            "submit",
            "--config",
            str(cfg),
            "--name",
            "demo",
            "--elastic",
            "1:2",
            "--nodes",
            "2",
            "--gpus-per-node",
            "0",
            "--pvc-size",
            "10Gi",
            "--api",
            "pytorchjob",
        )
        assert res.exit_code == 0, res.output
        before = _job(emu, "pytorchjobs")
        res = run(emu, "resize", "demo", "--nodes", "4")
        assert res.exit_code == 2 and "is elastic on 1..2 nodes; --nodes 4 is outside it" in res.output, res.output
        assert _job(emu, "pytorchjobs") == before
        assert run(emu, "resize", "demo", "--nodes", "1", "--gpus-per-node", "2").exit_code == 0
        job = _job(emu, "pytorchjobs")["spec"]
        assert list(job["pytorchReplicaSpecs"]) == ["Worker"] and job["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
        env = job["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["env"]
        assert {"name": "PET_NPROC_PER_NODE", "value": "2"} in env and job["elasticPolicy"]["maxReplicas"] == 2
