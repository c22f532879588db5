"""Commands for running on shared clusters: ``runtime render|install``, ``suspend`` and ``resume``.

    colbert-k8s runtime render [--name colbert-torch] [--max-restarts 3] [--nccl ib] [--priority-class P]
    colbert-k8s runtime install [--name colbert-torch] ...       (cluster-scoped: needs the right to create it)
    colbert-k8s suspend NAME       colbert-k8s resume NAME

``runtime`` prints or installs this image's ClusterTrainingRuntime (:mod:`operator_cli.kube.runtime`):
a TrainJob on it fails at once on a permanent exit code, and restarts otherwise. ``suspend`` and
``resume`` set a job's ``spec.runPolicy.suspend`` (PyTorchJob) or ``spec.suspend`` (TrainJob) with a merge
patch, only on jobs this tool created: the pods are removed and come back later, resuming from the
newest checkpoint (Kueue suspends and resumes jobs the same way). :func:`register` adds them to the
``cli`` group, with the CLI's own option helpers.
"""

from __future__ import annotations

import click

from operator_cli import constants as C
from operator_cli.render import to_yaml

__all__ = ["register"]


def _runtime_options(fn):
    from operator_cli.kube.runtime import RuntimeSpec

    d = RuntimeSpec()
    for option in reversed([
        click.option("--name", default=d.name, show_default=True, help="The ClusterTrainingRuntime's name."),
        click.option("--image", default=d.image, show_default=True, help="The node container's default image."),
        click.option("--max-restarts", default=d.max_restarts, show_default=True, type=int,
                     help="JobSet restarts for retryable failures (lost peer, preemption) before the job fails."),
        click.option("--nccl", type=click.Choice(["socket", "ib"]), help="NCCL network preset of the node container."),
        click.option("--shm-size", default=d.shm_size, show_default=True, help="Memory-backed /dev/shm; 0 disables."),
        click.option("--priority-class", help="PriorityClass of every pod (a TrainJob cannot set its own)."),
        click.option("--termination-grace-period", default=d.termination_grace, show_default=True, type=int,
                     help="Seconds from SIGTERM to SIGKILL; the trainer checkpoints in them."),
    ]):  # fmt: skip
        fn = option(fn)
    return fn


def _runtime_spec(o: dict):
    from operator_cli.kube.runtime import RuntimeSpec

    return RuntimeSpec(
        name=o["name"],
        image=o["image"],
        max_restarts=o["max_restarts"],
        nccl=o["nccl"],
        shm_size=None if o["shm_size"] in ("0", "") else o["shm_size"],
        priority_class=o["priority_class"],
        termination_grace=o["termination_grace_period"],
    )


def register(cli: click.Group, cluster_options, namespace_option, cluster_of, job_name) -> None:
    """Add ``runtime``, ``suspend`` and ``resume`` to ``cli`` (the helpers are the CLI's: one way to reach a
    cluster, one check of a NAME)."""

    @cli.group("runtime", cls=type(cli))
    def runtime_group() -> None:
        """This image's ClusterTrainingRuntime (Kubeflow Trainer v2): fail fast on exit 2, restart otherwise."""

    @runtime_group.command("render")
    @_runtime_options
    def runtime_render_cmd(**o) -> None:
        """Print the ClusterTrainingRuntime (the object `runtime install` creates)."""
        from operator_cli.kube.runtime import render_runtime

        click.echo(to_yaml([render_runtime(_runtime_spec(o))]), nl=False)

    @runtime_group.command("install")
    @_runtime_options
    @cluster_options
    def runtime_install_cmd(**o) -> None:
        """Create the ClusterTrainingRuntime, or update the one this tool created under that name."""
        from operator_cli.kube.runtime import install_runtime, render_runtime

        runtime = render_runtime(_runtime_spec(o))
        done = install_runtime(cluster_of({**o, "namespace": "default"}), runtime)
        name = runtime["metadata"]["name"]
        click.echo(f"{done} {C.V2_RUNTIME_KIND} {name}")
        use = "" if name == C.V2_SHIPPED_RUNTIME else f" --runtime {name}"
        click.echo(f"next: colbert-k8s submit --api trainjob{use} ... (exit 2 now fails the TrainJob at once)")

    def _set_suspended(name: str, suspend: bool, o: dict) -> None:
        name = job_name(name)
        kind, changed = cluster_of(o).suspend_job(name, suspend)
        verb = "suspended" if suspend else "resumed"
        if not changed:
            click.echo(f"{kind} {name} is already {verb}")
        elif suspend:
            click.echo(f"suspended {kind} {name}: its pods are removed; `colbert-k8s resume {name}` brings them back")
        else:
            click.echo(f"resumed {kind} {name}: new pods resume from the newest checkpoint "
                       f"(colbert-k8s logs {name} -f)")  # fmt: skip

    @cli.command("suspend")
    @click.argument("name")
    @namespace_option
    @cluster_options
    def suspend_cmd(name: str, **o) -> None:
        """Suspend a job this tool created: its pods go, the job and its storage stay."""
        _set_suspended(name, True, o)

    @cli.command("resume")
    @click.argument("name")
    @namespace_option
    @cluster_options
    def resume_cmd(name: str, **o) -> None:
        """Resume a suspended job: new pods resume from the newest checkpoint."""
        _set_suspended(name, False, o)
