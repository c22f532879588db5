"""``colbert-k8s resize NAME --nodes N``: the same job on another number of nodes (or GPUs per node).

A PyTorchJob's replica counts and a TrainJob's ``numNodes`` cannot be changed in place, so resize keeps
the job's storage and ConfigMap, deletes the job object and creates it again with the new shape; the
trainer resumes from the newest checkpoint on the claim. It refuses, before touching anything:

* per-pod storage (an ``emptyDir`` workspace): the new pods would start from step 0;
* a shape whose world size cannot hold ``training.global_batch_size``, or any other world size when the
  config does not set it (the checkpoint would be refused), naming the world sizes that work;
* for an elastic job (``elasticPolicy``), a node count outside its MIN..MAX.

Order matters: the ConfigMap is owned by the job, so its ownerReference is dropped first (a foreground
delete would take it along), and set to the new job's uid after the create.
"""

from __future__ import annotations

import time

from operator_cli.errors import CliError
from operator_cli.kube.cluster import Cluster
from operator_cli.kube.kinds import kind_of, workspace_claim
from operator_cli.spec import check_shape, parse_training_config

__all__ = ["resize"]


def resize(cluster: Cluster, name: str, nodes: int, gpus_per_node: int | None, wait_seconds: float = 120) -> dict:
    """Recreate job ``name`` with ``nodes`` nodes (and ``gpus_per_node``); returns the new job object."""
    job = cluster.get_own_job(name)
    kind = kind_of(job)
    old_nodes, old_gpus = kind.nodes_and_gpus(job)
    gpus = old_gpus if gpus_per_node is None else gpus_per_node
    check_shape(nodes, gpus)
    if not workspace_claim(job):
        raise CliError(
            f"{kind.kind} {cluster.ns}/{name} keeps its checkpoints in each pod's emptyDir (--pod-local-storage): "
            "recreating it would start over from step 0",
            hint="resize needs a job whose /workspace is a PVC (--pvc or --pvc-size)",
        )
    _check_world_size(cluster, name, old_nodes * max(1, old_gpus), nodes * max(1, gpus))
    new = kind.reshaped(job, nodes, gpus)
    cluster.own_config_map(name, None)
    cluster.delete(kind.kind, name)
    deadline = time.monotonic() + wait_seconds
    while cluster.job_exists(name):
        if time.monotonic() > deadline:
            raise CliError(
                f"{kind.kind} {cluster.ns}/{name} is still being deleted after {wait_seconds:.0f}s",
                hint=f"run `colbert-k8s resize {name} ...` again once it is gone; the storage and config are kept",
            )
        time.sleep(1)
    created = cluster.create(new)
    cluster.own_config_map(name, created)
    return created


def _check_world_size(cluster: Cluster, name: str, old: int, new: int) -> None:
    """The new world size can hold the config's global batch, and its checkpoint will be accepted."""
    if old == new:
        return
    from trainer.config.schema import ConfigError  # pydantic: kept out of the CLI's import
    from trainer.scale import micro_batches

    cfg = parse_training_config(cluster.config_text(name) or "")
    if cfg.training.global_batch_size is None:
        raise CliError(
            f"job {name} runs on {old} processes and its config does not set training.global_batch_size: its "
            f"checkpoint would be refused on {new}",
            hint="set training.global_batch_size (an elastic job) and submit it again, or keep the world size",
        )
    try:
        micro_batches(cfg, new)
    except ConfigError as e:
        raise CliError(f"cannot resize job {name}: {e}") from None
