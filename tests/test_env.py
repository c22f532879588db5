"""Every way the trainer can be started, with the exact variables each sets (no torch needed)."""

from __future__ import annotations

import pytest

from trainer.env import EnvError, Launch, Layout, resolve

CASES = [
    # name, env, gpus, expected
    (
        "torchrun-child",
        {"LOCAL_RANK": "1", "RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"},
        2,
        Layout(rank=3, world_size=4, local_rank=1, master_addr="job-master-0", master_port=23456, mode="torchrun"),
    ),
    (
        "pytorchjob-one-proc-per-pod",  # Worker 1 of a 3-replica job with nprocPerNode=1
        {
            "RANK": "2",
            "WORLD_SIZE": "3",
            "MASTER_ADDR": "job-master-0",
            "MASTER_PORT": "23456",
            "PET_NPROC_PER_NODE": "1",
            "PET_NNODES": "3",
            "PET_NODE_RANK": "2",
            "PYTHONUNBUFFERED": "1",
        },
        1,
        Layout(rank=2, world_size=3, local_rank=0, master_addr="job-master-0", master_port=23456, mode="pytorchjob"),
    ),
    (
        "pytorchjob-nproc-auto-cpu",  # nprocPerNode unset -> "auto"; operator counts 1 per pod
        {
            "RANK": "0",
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "job-master-0",
            "MASTER_PORT": "23456",
            "PET_NPROC_PER_NODE": "auto",
            "PET_NNODES": "2",
            "PET_NODE_RANK": "0",
        },
        0,
        Layout(rank=0, world_size=2, local_rank=0, master_addr="job-master-0", master_port=23456, mode="pytorchjob"),
    ),
    (
        "pytorchjob-nproc-8",  # RANK is a node index here, so torchrun must take over
        {
            "RANK": "1",
            "WORLD_SIZE": "16",
            "MASTER_ADDR": "job-master-0",
            "MASTER_PORT": "23456",
            "PET_NPROC_PER_NODE": "8",
            "PET_NNODES": "2",
            "PET_NODE_RANK": "1",
            "PET_MASTER_ADDR": "job-master-0",
            "PET_MASTER_PORT": "23456",
        },
        8,
        Launch(
            nnodes="2",
            nproc_per_node="8",
            node_rank=1,
            master_addr="job-master-0",
            master_port=23456,
            mode="pytorchjob-torchrun",
        ),
    ),
    (
        "trainjob-v2",  # Trainer v2 injects only PET_*
        {
            "PET_NNODES": "2",
            "PET_NPROC_PER_NODE": "4",
            "PET_NODE_RANK": "0",
            "PET_MASTER_ADDR": "tj-node-0-0.tj",
            "PET_MASTER_PORT": "29500",
        },
        4,
        Launch(
            nnodes="2",
            nproc_per_node="4",
            node_rank=0,
            master_addr="tj-node-0-0.tj",
            master_port=29500,
            mode="trainjob",
        ),
    ),
    ("docker-multi-gpu", {}, 4, Launch("1", "4", 0, None, None, mode="standalone")),
    ("docker-one-gpu", {}, 1, Layout(mode="single")),
    ("laptop-cpu", {"HOME": "/root"}, 0, Layout(mode="single")),
]


@pytest.mark.parametrize("name,env,gpus,expected", CASES, ids=[c[0] for c in CASES])
def test_launch_modes(name, env, gpus, expected):
    assert resolve(env, gpus) == expected


def test_torchrun_args_multi_node():
    plan = resolve(CASES[3][1], 8)
    assert plan.torchrun_args() == [
        "--nnodes=2",
        "--nproc_per_node=8",
        "--node_rank=1",
        "--master_addr=job-master-0",
        "--master_port=23456",
    ]
    assert resolve({}, 4).torchrun_args() == ["--nnodes=1", "--nproc_per_node=4", "--standalone"]


# What the Training Operator v1.9.4 injects into a Worker of an elastic PyTorchJob (no Master: no
# MASTER_*, RANK, WORLD_SIZE, PET_NODE_RANK); PET_NPROC_PER_NODE is the manifest's own.
ELASTIC = {
    "PYTHONUNBUFFERED": "0",
    "PET_RDZV_ENDPOINT": "job-worker-0:23456",
    "PET_RDZV_BACKEND": "c10d",
    "PET_NNODES": "1:3",
    "PET_MAX_RESTARTS": "3",
    "PET_NPROC_PER_NODE": "8",
}


def test_an_elastic_worker_starts_torchs_elastic_agent():
    plan = resolve(ELASTIC, 8)
    assert isinstance(plan, Launch) and plan.mode == "elastic"
    assert plan.torchrun_args() == [
        "--nnodes=1:3",
        "--nproc_per_node=8",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=job-worker-0:23456",
        "--max_restarts=3",
    ]
    local = resolve({**ELASTIC, "PET_RDZV_CONF": "is_host=false"}, 0)  # colbert-k8s local says who hosts the store
    assert "--rdzv_conf=is_host=false" in local.torchrun_args()


BAD = [
    ("rank-ge-world", {"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "m"}, 0, "RANK=2 must be below WORLD_SIZE=2"),
    ("no-master-addr", {"RANK": "0", "WORLD_SIZE": "2"}, 0, "MASTER_ADDR is not set"),
    ("non-int-rank", {"RANK": "zero", "WORLD_SIZE": "2", "MASTER_ADDR": "m"}, 0, "RANK='zero' is not an integer"),
    ("non-int-world", {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "2x"}, 0, "WORLD_SIZE='2x' is not an integer"),
    (
        "local-rank-beyond-gpus",
        {"LOCAL_RANK": "2", "RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "m"},
        2,
        "LOCAL_RANK=2 but only 2 GPU(s) are visible",
    ),
    ("bad-port", {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "m", "MASTER_PORT": "70000"}, 0, "MASTER_PORT=70000"),
    (
        "pet-node-rank",
        {"PET_NNODES": "2", "PET_NODE_RANK": "2", "PET_NPROC_PER_NODE": "2", "PET_MASTER_ADDR": "m"},
        0,
        "PET_NODE_RANK=2 must be below PET_NNODES=2",
    ),
    (
        "pet-no-master",
        {"PET_NNODES": "2", "PET_NODE_RANK": "0", "PET_NPROC_PER_NODE": "2"},
        0,
        "PET_MASTER_ADDR is not set",
    ),
    ("nproc-beyond-gpus", {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "8"}, 4, "PET_NPROC_PER_NODE=8 but only 4 GPU"),
    ("nproc-a-word", {"PET_NPROC_PER_NODE": "x"}, 0, "PET_NPROC_PER_NODE='x' must be a positive integer"),
    ("nproc-zero", {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "0"}, 0, "PET_NPROC_PER_NODE='0' must be"),
    ("nnodes-words", {"PET_NNODES": "x:y", "PET_MASTER_ADDR": "m"}, 0, "PET_NNODES='x:y' must be N or MIN:MAX"),
    ("rdzv-no-port", {**ELASTIC, "PET_RDZV_ENDPOINT": "job-worker-0"}, 0, "PET_RDZV_ENDPOINT='job-worker-0' must be"),
    ("rdzv-backwards", {**ELASTIC, "PET_NNODES": "3:1"}, 0, "PET_NNODES='3:1' must be N or MIN:MAX"),
    ("rdzv-etcd", {**ELASTIC, "PET_RDZV_BACKEND": "etcd"}, 0, "only c10d is supported"),
    ("rdzv-restarts", {**ELASTIC, "PET_MAX_RESTARTS": "many"}, 0, "PET_MAX_RESTARTS='many' is not an integer"),
]


@pytest.mark.parametrize("name,env,gpus,message", BAD, ids=[c[0] for c in BAD])
def test_inconsistent_environment_is_refused(name, env, gpus, message):
    with pytest.raises(EnvError, match=None) as e:
        resolve(env, gpus)
    assert message in str(e.value)
    assert "\n" not in str(e.value)
