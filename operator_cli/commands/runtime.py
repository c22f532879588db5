"""``runtime render|install``: this image's ClusterTrainingRuntime (:mod:`operator_cli.kube.runtime`).

    colbert-k8s runtime render [--name colbert-torch] [--max-restarts 3] [--nccl ib] [--priority-class P]
    colbert-k8s runtime install [--name colbert-torch] ...       (cluster-scoped: needs the right to create it)

A TrainJob on it fails at once on a permanent exit code, and restarts otherwise.
"""

from __future__ import annotations

import click

from operator_cli import constants as C
from operator_cli.commands.base import Command, Group, cluster_of, cluster_options
from operator_cli.kube.runtime import RuntimeSpec, install_runtime, render_runtime
from operator_cli.render import to_yaml
from operator_cli.values import NCCL_PRESETS

__all__ = ["runtime_group"]


def _runtime_options(fn):
    d = RuntimeSpec()
    for option in reversed([
        click.option("--name", default=d.name, show_default=True, help="The ClusterTrainingRuntime's name."),
        click.option("--image", default=d.image, show_default=True, help="The node container's default image."),
        click.option("--max-restarts", default=d.max_restarts, show_default=True, type=int,
                     help="JobSet restarts for retryable failures (lost peer, preemption) before the job fails."),
        click.option("--nccl", type=click.Choice(tuple(NCCL_PRESETS)),
                     help="NCCL network preset of the node container."),
        click.option("--shm-size", default=d.shm_size, show_default=True, help="Memory-backed /dev/shm; 0 disables."),
        click.option("--priority-class", help="PriorityClass of every pod (a TrainJob cannot set its own)."),
        click.option("--termination-grace-period", default=d.termination_grace, show_default=True, type=int,
                     help="Seconds from SIGTERM to SIGKILL; the trainer checkpoints in them."),
    ]):  # fmt: skip
        fn = option(fn)
    return fn


def _runtime_spec(o: dict) -> RuntimeSpec:
    return RuntimeSpec(
        name=o["name"],
        image=o["image"],
        max_restarts=o["max_restarts"],
        nccl=o["nccl"],
        shm_size=None if o["shm_size"] in ("0", "") else o["shm_size"],
        priority_class=o["priority_class"],
        termination_grace=o["termination_grace_period"],
    )


@click.group("runtime", cls=Group)
def runtime_group() -> None:
    """This image's ClusterTrainingRuntime (Kubeflow Trainer v2): fail fast on exit 1-127, restart otherwise."""


@runtime_group.command("render", cls=Command)
@_runtime_options
def runtime_render_cmd(**o) -> None:
    """Print the ClusterTrainingRuntime (the object `runtime install` creates)."""
    click.echo(to_yaml([render_runtime(_runtime_spec(o))]), nl=False)


@runtime_group.command("install", cls=Command)
@_runtime_options
@cluster_options
def runtime_install_cmd(**o) -> None:
    """Create the ClusterTrainingRuntime, or update the one this tool created under that name."""
    runtime = render_runtime(_runtime_spec(o))
    done = install_runtime(cluster_of({**o, "namespace": "default"}), runtime)
    name = runtime["metadata"]["name"]
    click.echo(f"{done} {C.V2_RUNTIME_KIND} {name}")
    use = "" if name == C.V2_SHIPPED_RUNTIME else f" --runtime {name}"
    click.echo(f"next: colbert-k8s submit --api trainjob{use} ... (exit 1-127 now fails the TrainJob at once)")
