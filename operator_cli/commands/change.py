"""The commands that change a job this tool created: ``resize``, ``delete``, ``suspend`` and ``resume``.

``suspend`` and ``resume`` set the job's own suspend field with a merge patch (its kind's:
``JobKind.suspend_patch``): the pods are removed and come back later, resuming from the newest checkpoint
(Kueue suspends and resumes jobs the same way). Each acts only on jobs that carry this tool's labels.
"""

from __future__ import annotations

import click

from operator_cli.commands.base import Command, cluster_of, cluster_options, job_name, namespace_option
from operator_cli.errors import CliError
from operator_cli.resize import resize
from operator_cli.spec import check_shape
from operator_cli.tune.cluster import delete_sweep

__all__ = ["delete_cmd", "resize_cmd", "resume_cmd", "suspend_cmd"]


@click.command("resize", cls=Command)
@click.argument("name")
@namespace_option
@cluster_options
@click.option("--nodes", type=int, required=True, help="The new number of nodes (pods).")
@click.option("--gpus-per-node", type=int, default=None, help="The new GPUs per node (default: unchanged).")
def resize_cmd(name: str, nodes: int, gpus_per_node: int | None, **o) -> None:
    """Run the job on another number of nodes: keep its storage and config, recreate it with the new shape.

    The trainer resumes from the newest checkpoint. Needs a PVC workspace, and training.global_batch_size
    in the config when the world size changes."""
    name = job_name(name)
    check_shape(nodes, gpus_per_node)  # before any request, as every other flag
    job = resize(cluster_of(o), name, nodes, gpus_per_node)
    click.echo(
        f"resized {job['kind']} {job['metadata'].get('namespace', '')}/{name} to {nodes} node(s); "
        f"it resumes from its newest checkpoint (colbert-k8s logs {name} -f)"
    )


@click.command("delete", cls=Command)
@click.argument("name")
@namespace_option
@cluster_options
@click.option(
    "--keep-storage", is_flag=True, help="Keep the PVC created by --pvc-size (it holds checkpoints and the model)."
)
def delete_cmd(name: str, keep_storage: bool, **o) -> None:
    """Remove the job or sweep and everything this tool created for it."""
    name = job_name(name)
    cluster = cluster_of(o)
    try:
        removed = cluster.delete_job(name, keep_storage)
    except CliError as e:
        if e.status != 404:
            raise
        try:  # no job of that name: a sweep (tune) then, its trials and their jobs with it
            removed = delete_sweep(cluster, name, keep_storage)
        except CliError as missing:
            if missing.status != 404:
                raise
            raise e from None
    for what in removed:
        click.echo(f"deleted {what}")
    for what in cluster.skipped:
        click.echo(f"kept {what}", err=True)


def _set_suspended(name: str, suspend: bool, o: dict) -> None:
    name = job_name(name)
    kind, changed = cluster_of(o).suspend_job(name, suspend)
    verb = "suspended" if suspend else "resumed"
    if not changed:
        click.echo(f"{kind} {name} is already {verb}")
    elif suspend:
        click.echo(f"suspended {kind} {name}: its pods are removed; `colbert-k8s resume {name}` brings them back")
    else:
        click.echo(f"resumed {kind} {name}: new pods resume from the newest checkpoint (colbert-k8s logs {name} -f)")


@click.command("suspend", cls=Command)
@click.argument("name")
@namespace_option
@cluster_options
def suspend_cmd(name: str, **o) -> None:
    """Suspend a job this tool created: its pods go, the job and its storage stay."""
    _set_suspended(name, True, o)


@click.command("resume", cls=Command)
@click.argument("name")
@namespace_option
@cluster_options
def resume_cmd(name: str, **o) -> None:
    """Resume a suspended job: new pods resume from the newest checkpoint."""
    _set_suspended(name, False, o)
