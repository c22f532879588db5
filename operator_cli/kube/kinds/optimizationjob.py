"""Kubeflow Trainer's ``OptimizationJob`` (``trainer.kubeflow.org/v1alpha1``), **experimental**: the CRD is on
Trainer's main branch (KEP-3562) and its controller is not released (kubeflow/trainer#3828), so what it does
with a template is the KEP's word, not a release's.

Its trials are TrainJobs made from ``trainJobTemplate``. Following the KEP, a trial's values reach the template
by string templating (``{{.training_learning_rate}}``), here in ``colbert-train --set`` arguments; the objective
is read from the TrainJob's status, where the trainer already posts ``ndcg@10`` and the other metrics. The
template names no trial, so trials cannot tell their output directories apart on a shared claim: a sweep on a
claim is refused, each trial keeps its own emptyDir. The CRD has no early stopping: ``--early-stop`` is refused.
"""

from __future__ import annotations

from typing import Any

from operator_cli.errors import CliError
from operator_cli.jobshape import SweepShape
from operator_cli.kube.kinds.sweeps import SweepKind, plain_value, sweep_state, trial_value
from operator_cli.kube.kinds.trainjob import TrainJob
from operator_cli.tune.space import Space

__all__ = ["OptimizationJob"]

PARAM_ANNOTATION = "trainer.kubeflow.org/opt-param-"  # the controller PR's record of a trial's values


def search_space(space: Space, grid: bool) -> dict[str, Any]:
    """One parameter's ``searchSpace``: uniform or log-uniform bounds (Float or Int), or categorical choices
    (a grid takes categorical spaces only: an int range is written out); each choice as the trial's ``--set``
    reads it back (:func:`~operator_cli.kube.kinds.sweeps.trial_value`).

    >>> from operator_cli.tune.space import parse_space
    >>> search_space(parse_space("training.max_steps=int(2,4)"), grid=True)
    {'categorical': {'choices': ['2', '3', '4']}}
    """
    if space.kind == "choice" or grid:
        return {"categorical": {"choices": [trial_value(space.key, v) for v in space.grid()]}}
    if space.kind == "int":
        return {"uniform": {"min": str(space.low), "max": str(space.high), "type": "Int"}}
    key = "logUniform" if space.kind == "loguniform" else "uniform"
    return {key: {"min": plain_value(space.low), "max": plain_value(space.high), "type": "Float"}}


class OptimizationJob(SweepKind):
    """A Trainer OptimizationJob whose trial template is the rendered TrainJob."""

    api = "optimizationjob"
    group = "trainer.kubeflow.org"
    version = "v1alpha1"
    plural = "optimizationjobs"
    kind = "OptimizationJob"
    product = "Kubeflow Trainer's OptimizationJob controller (unreleased: kubeflow/trainer#3828)"
    install = "build Kubeflow Trainer from its main branch with the OptimizationJob controller"
    template = "optimizationjob.yaml.j2"
    trial_api = "trainjob"
    experimental = True

    def check(self, sweep: SweepShape) -> None:
        if sweep.job.api != self.trial_api:
            raise CliError(
                f"--engine optimizationjob runs TrainJob trials; --api {sweep.job.api} is not one",
                hint="drop --api, or use --engine katib for PyTorchJob trials",
            )
        if sweep.job.claim_name:
            raise CliError(
                "--engine optimizationjob names no trial in its template: trials on a shared claim "
                "(--pvc, --pvc-size) would write one output_dir",
                hint="drop --pvc/--pvc-size (each trial keeps its own emptyDir), or use --engine katib",
            )
        if sweep.early_stop is not None:
            raise CliError(
                "--engine optimizationjob has no early stopping (its CRD has no field for it)",
                hint="drop --early-stop, or use --engine katib (medianstop) or --local",
            )
        if sweep.algorithm == "bayesian":
            raise CliError(
                "--engine optimizationjob offers random and grid search",
                hint="use --algorithm random, or --engine katib for bayesian",
            )
        if sweep.trial_count > 100 or any(len(s.grid()) > 100 for s in sweep.params if sweep.algorithm == "grid"):
            raise CliError("an OptimizationJob runs at most 100 trials of at most 100 choices per parameter")

    def trial_args(self, sweep: SweepShape) -> list[str]:
        args = []
        for space in sweep.params:
            args += ["--set", f"{space.key}={{{{.{space.name}}}}}"]
        return args

    def context(self, sweep: SweepShape, trial: dict[str, Any]) -> dict[str, Any]:
        meta = {k: v for k, v in trial["metadata"].items() if k in ("labels", "annotations")}
        grid = sweep.algorithm == "grid"
        return {
            "trial_template": {"metadata": meta, "spec": trial["spec"]},
            "parameters": [{"name": s.name, "searchSpace": search_space(s, grid)} for s in sweep.params],
            "direction": "Maximize" if sweep.goal == "max" else "Minimize",
        }

    def trials(self, cluster: Any, sweep: dict[str, Any]) -> list[dict[str, Any]]:
        """The TrainJobs the OptimizationJob owns, with the values the controller recorded on them."""
        uid = sweep["metadata"].get("uid")
        trainjob = TrainJob()
        fn = lambda: trainjob.list(cluster.custom, cluster.ns, "")  # noqa: E731
        rows = []
        for job in cluster.items(fn, trainjob.kind):
            owners = job.get("metadata", {}).get("ownerReferences") or []
            if not any(o.get("uid") == uid and o.get("kind") == self.kind for o in owners):
                continue
            notes = job["metadata"].get("annotations") or {}
            values = {k.removeprefix(PARAM_ANNOTATION): v for k, v in notes.items() if k.startswith(PARAM_ANNOTATION)}
            rows.append(
                {
                    "name": job["metadata"]["name"],
                    "values": values,
                    "state": sweep_state(job),
                    "metric": None,
                    "seconds": None,
                    "reason": None,
                }
            )
        return sorted(rows, key=lambda r: r["name"])

    def best_name(self, sweep: dict[str, Any]) -> str | None:
        return (sweep.get("status", {}).get("result") or {}).get("trainJobName") or None
