"""The job kinds this tool submits, one :class:`JobKind` each: PyTorchJob (Training Operator v1) and TrainJob
(Kubeflow Trainer v2). Every other module finds a kind here, by its ``--api`` name (:data:`KINDS`), or by a
live job's ``kind`` (:func:`kind_of`), and asks it; none tests which one it has.

Adding a kind: a :class:`JobKind` subclass in a module of this package, listed in :data:`KINDS`, and its
template (``operator_cli/templates/<api>.yaml.j2``), plus the chart's.

The sweep kinds (``colbert-k8s tune``), whose trial template is a job kind's render, are :data:`SWEEPS`
(:mod:`.sweeps`): a Katib Experiment and a Trainer OptimizationJob.

KServe's InferenceService (``inferenceservice.py``, ``colbert-k8s serve``) sits beside them too: a served model,
reached the same way, but no job (nothing to resize or replay), so it is in neither.
"""

from __future__ import annotations

from typing import Any

from operator_cli.kube.kinds import base
from operator_cli.kube.kinds.base import JobKind, find_all, job_state, workspace_claim
from operator_cli.kube.kinds.katib import KatibExperiment
from operator_cli.kube.kinds.optimizationjob import OptimizationJob
from operator_cli.kube.kinds.pytorchjob import PyTorchJob
from operator_cli.kube.kinds.sweeps import SweepKind
from operator_cli.kube.kinds.trainjob import TrainJob
from operator_cli.podplan import PodPlan

__all__ = [
    "API_CHOICES",
    "AUTO_ORDER",
    "DEFAULT_API",
    "JobKind",
    "KINDS",
    "SWEEPS",
    "SweepKind",
    "find_all",
    "job_state",
    "kind_named",
    "kind_of",
    "plan_pods",
    "shape_problem",
    "sweep_named",
    "workspace_claim",
]

KINDS: dict[str, JobKind] = {k.api: k for k in (PyTorchJob(), TrainJob())}
"""By ``--api`` name; the first is JobSpec's and the chart's default."""
DEFAULT_API = next(iter(KINDS))
AUTO_ORDER = ("trainjob", "pytorchjob")  # --api auto: the first the cluster serves (Trainer v2 is the current API)
API_CHOICES = (*KINDS, "auto")  # --api: a kind, or auto (what the cluster serves)
_BY_KIND = {k.kind: k for k in KINDS.values()}
SWEEPS: dict[str, SweepKind] = {k.api: k for k in (KatibExperiment(), OptimizationJob())}
"""By ``tune --engine`` name; the first is the default."""


def kind_named(kind: str) -> JobKind | None:
    """The kind whose objects have ``kind: <kind>``, or None for any other object (a ConfigMap, a Pod)."""
    return _BY_KIND.get(kind)


def sweep_named(kind: str) -> SweepKind | None:
    """The sweep kind whose objects have ``kind: <kind>``, or None."""
    return next((k for k in SWEEPS.values() if k.kind == kind), None)


def kind_of(job: dict[str, Any]) -> JobKind:
    """A live or rendered job's kind; an answer without a known ``kind`` reads as the default (v1) one."""
    return _BY_KIND.get(job.get("kind"), KINDS[DEFAULT_API])


def shape_problem(job: Any) -> str | None:
    """The first field of a job answer that is not the type this tool reads it as, or None."""
    return base.shape_problem(job, list(KINDS.values()))


def plan_pods(objects: list[dict[str, Any]]) -> PodPlan:
    """The plan of the job among ``objects``, read by its kind; a TrainJob's ClusterTrainingRuntime may be among
    them too (``local`` adds the ones it knows, :func:`operator_cli.kube.runtime.known_runtime`)."""
    job = next(o for o in objects if kind_named(o["kind"]))
    return kind_named(job["kind"]).plan(job, objects)
