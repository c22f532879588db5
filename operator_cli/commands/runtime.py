"""``runtime render|install``: this image's ClusterTrainingRuntime (:mod:`operator_cli.kube.runtime`).

    colbert-k8s runtime render [--name colbert-torch] [--max-restarts 3] [--nccl ib] [--priority-class P]
    colbert-k8s runtime install [--name colbert-torch] ...       (cluster-scoped: needs the right to create it)

A TrainJob on it fails at once on a permanent exit code, and restarts otherwise. The options are
:data:`operator_cli.kube.runtime.RUNTIME_OPTIONS`: the pod template's are the job options themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from operator_cli import constants as C
from operator_cli.commands.base import Command, Group, click_option, cluster_of, cluster_options
from operator_cli.kube.runtime import RUNTIME_OPTIONS, RuntimeSpec, install_runtime, render_runtime
from operator_cli.render import to_yaml

__all__ = ["runtime_group"]


def _runtime_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    defaults = RuntimeSpec.defaults()
    for option in reversed(RUNTIME_OPTIONS):  # the last decorator applied is the first option listed
        fn = click_option(option, defaults)(fn)
    return fn


def _runtime_spec(o: dict[str, Any]) -> RuntimeSpec:
    """Options -> RuntimeSpec: each option's value through its parser (``--shm-size 0`` -> no /dev/shm)."""
    values = {opt.spec_field: o[opt.key] for opt in RUNTIME_OPTIONS}
    for opt in RUNTIME_OPTIONS:
        if opt.parse and values[opt.spec_field] is not None:
            values[opt.spec_field] = opt.parse(values[opt.spec_field])
    return RuntimeSpec(**values)


@click.group("runtime", cls=Group)
def runtime_group() -> None:
    """This image's ClusterTrainingRuntime (Kubeflow Trainer v2): fail fast on exit 1-127, restart otherwise."""


@runtime_group.command("render", cls=Command)
@_runtime_options
def runtime_render_cmd(**o: Any) -> None:
    """Print the ClusterTrainingRuntime (the object `runtime install` creates)."""
    click.echo(to_yaml([render_runtime(_runtime_spec(o))]), nl=False)


@runtime_group.command("install", cls=Command)
@_runtime_options
@cluster_options
def runtime_install_cmd(**o: Any) -> None:
    """Create the ClusterTrainingRuntime, or update the one this tool created under that name."""
    runtime = render_runtime(_runtime_spec(o))
    done = install_runtime(cluster_of({**o, "namespace": "default"}), runtime)
    name = runtime["metadata"]["name"]
    click.echo(f"{done} {C.V2_RUNTIME_KIND} {name}")
    use = "" if name == C.V2_SHIPPED_RUNTIME else f" --runtime {name}"
    click.echo(f"next: colbert-k8s submit --api trainjob{use} ... (exit 1-127 now fails the TrainJob at once)")
