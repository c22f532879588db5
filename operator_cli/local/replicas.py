"""The processes a rendered job asks for: each pod's environment, command and working directory.

The launcher's variables come from :meth:`PodPlan.launcher_env` (the same code the tests use); mount
paths in the container's command and env are mapped to local directories.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import click

from operator_cli import constants as C
from operator_cli.kube.kinds import plan_pods
from operator_cli.local.workspaces import pod_workspace, shares_workspace
from operator_cli.objects import KubeObject
from operator_cli.podplan import PodPlan

__all__ = ["Replica", "plan_replicas", "unsupported"]

POD_TAG = "COLBERT_K8S_LOCAL_POD"  # in every process a replica starts: what its container would hold
_DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


@dataclass
class Replica:
    """One pod of the job, as a local process group."""

    replica: str  # master-0, worker-0, ...
    host: str  # the pod's DNS name on a cluster: <job>-master-0
    index: int  # RANK = PET_NODE_RANK
    command: list[str]
    env: dict[str, str]
    cwd: Path
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def tag(self) -> bytes:
        """The ``NAME=value`` entry every process of this replica inherits, whatever session it is in."""
        return f"{POD_TAG}={self.env[POD_TAG]}".encode()


def unsupported(plan: PodPlan, gpus_here: int) -> list[str]:
    """Fields of the manifest this machine cannot honour, one phrase each."""
    notes = []
    pod, container = plan.pod_spec, plan.container
    limits = container.get("resources", {}).get("limits", {})
    gpus = sum(int(v) for k, v in limits.items() if k == C.GPU_RESOURCE or k.startswith(C.MIG_RESOURCE_PREFIX))
    if gpus > gpus_here:
        notes.append(f"{gpus} GPU(s) per node requested, {gpus_here} here (processes use what is visible)")
    for key, what in (
        ("nodeSelector", "node selector"),
        ("tolerations", "tolerations"),
        ("priorityClassName", "priority class"),
        ("serviceAccountName", "service account"),
        ("imagePullSecrets", "image pull secrets"),
    ):
        if pod.get(key):
            notes.append(f"{what} ignored")
    if {"cpu", "memory"} & limits.keys():
        notes.append("cpu/memory limits not enforced")
    notes.append(f"image {container['image']} not used (runs this checkout's code)")
    if plan.runtime_note:
        notes.append(plan.runtime_note)
    return notes


def plan_replicas(
    objects: list[KubeObject],
    workdir: Path,
    config_dir: Path,
    master_addr: str,
    master_port: int,
) -> list[Replica]:
    """The processes the launcher would start, with their environment, command and working dir."""
    plan = plan_pods(objects)
    shared = shares_workspace(plan)

    def local_path(value: str, workspace: Path) -> str:
        for mount, local in {C.CONFIG_MOUNT: config_dir, C.WORKSPACE_MOUNT: workspace}.items():
            if value == mount or value.startswith(mount + "/"):
                return str(local) + value[len(mount) :]
        return value

    base = {k: v for k, v in os.environ.items() if k not in _DIST_VARS and not k.startswith("PET_")}
    base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"
    base["TQDM_MININTERVAL"] = "5"  # progress lines every 5 s, not a carriage-return storm
    container = plan.container
    replicas = []
    for index, (host, replica) in enumerate(zip(plan.hosts, plan.replica_names)):
        workspace = workdir if shared else pod_workspace(workdir, host)
        env = {**base, **plan.launcher_env(index, master_addr, master_port), "HOSTNAME": host}  # as in a pod
        env[POD_TAG] = f"{os.getpid()}-{replica}"  # this run's replica: kill_group finds its processes by it
        for var in container.get("env", []):
            if "value" in var:
                env[var["name"]] = local_path(var["value"], workspace)
            elif var["name"] not in os.environ and index == 0:  # a secretKeyRef: from this shell if set there
                click.echo(
                    f"local: {var['name']} comes from a Secret on the cluster; export it here to use it", err=True
                )
        command = [local_path(a, workspace) for a in container.get("command", []) + container.get("args", [])]
        cwd = Path(local_path(container.get("workingDir", C.WORKSPACE_MOUNT), workspace))
        replicas.append(Replica(replica, host, index, command, env, cwd))
    return replicas
