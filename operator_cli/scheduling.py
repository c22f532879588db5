"""Scheduling on shared clusters: Kueue's topology-aware placement and MIG slices, checked in one place.

``--topology-required LEVEL`` / ``--topology-preferred LEVEL`` become Kueue's
``kueue.x-k8s.io/podset-required-topology`` / ``podset-preferred-topology`` annotations on every pod
template (Kueue reads them on the pod templates of any job kind it manages; topology-aware scheduling is
beta and on by default since Kueue 0.14). LEVEL is a node label key such as
``cloud.google.com/gce-topology-block``: a level of one of the cluster's Kueue ``Topology`` objects.

``--mig PROFILE`` asks for ``nvidia.com/mig-<PROFILE>`` (the NVIDIA device plugin's "mixed" strategy)
instead of ``nvidia.com/gpu``. ``--gpus-per-node`` then counts slices, and must be 1: CUDA shows a
process a single MIG device, so one pod trains on one slice; scale out with ``--nodes``.

Only the *forms* are checked here (without a cluster); ``colbert-k8s doctor`` lists the Topology and
ResourceFlavor objects and the MIG resources the nodes offer.
"""

from __future__ import annotations

from operator_cli import rules
from operator_cli.constants import GPU_RESOURCE, KUEUE_TOPOLOGY_PREFERRED, KUEUE_TOPOLOGY_REQUIRED, MIG_RESOURCE_PREFIX
from operator_cli.errors import CliError
from operator_cli.jobshape import JobShape
from operator_cli.values import shown

__all__ = ["check", "gpu_resource", "topology_annotations"]


def gpu_resource(mig: str | None) -> str:
    """The resource one GPU process asks for.

    >>> gpu_resource(None), gpu_resource("1g.10gb")
    ('nvidia.com/gpu', 'nvidia.com/mig-1g.10gb')
    """
    return f"{MIG_RESOURCE_PREFIX}{mig}" if mig else GPU_RESOURCE


def topology_annotations(required: str | None, preferred: str | None) -> dict[str, str]:
    """Kueue's pod-set topology annotation for a level (``required`` wins; both together are refused earlier).

    >>> topology_annotations(None, "kubernetes.io/hostname")
    {'kueue.x-k8s.io/podset-preferred-topology': 'kubernetes.io/hostname'}
    >>> topology_annotations(None, None)
    {}
    """
    if required:
        return {KUEUE_TOPOLOGY_REQUIRED: required}
    return {KUEUE_TOPOLOGY_PREFERRED: preferred} if preferred else {}


def check(spec: JobShape) -> None:
    """The scheduling options of a job spec, each refused in one line naming the flag and the fix."""
    if spec.topology_required and spec.topology_preferred:
        raise CliError(
            "--topology-required and --topology-preferred exclude each other (Kueue reads one per pod set)",
            hint="keep --topology-required LEVEL to insist, or --topology-preferred LEVEL to ask",
        )
    for flag, value in (
        ("--topology-required", spec.topology_required),
        ("--topology-preferred", spec.topology_preferred),
    ):
        if value is not None and not rules.full("qualified_name", value):
            raise CliError(
                f"{flag} must be a node label key naming a topology level, like "
                f"cloud.google.com/gce-topology-block or kubernetes.io/hostname, got {shown(value)}"
            )
    for key in spec.topology_annotations:
        if key in spec.annotations:
            raise CliError(f"--annotation {key} is also set by --topology-*; drop one of them")
    if spec.mig is None:
        return
    if not rules.full("mig_profile", spec.mig):
        raise CliError(
            "--mig must be a MIG profile like 1g.10gb, 3g.40gb or 1g.10gb+me (nvidia-smi mig -lgip lists them), "
            f"got {shown(spec.mig)}"
        )
    if spec.gpus_per_node != 1:
        raise CliError(
            f"--mig {spec.mig} takes one slice per pod, got --gpus-per-node {spec.gpus_per_node}: a CUDA process "
            "sees a single MIG device, so a pod cannot train on several",
            hint="use --gpus-per-node 1 (the default) and scale out with --nodes",
        )
