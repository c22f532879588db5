"""Katib's ``Experiment`` (``kubeflow.org/v1beta1``): the hyperparameter search clusters run today, its trials
PyTorchJobs (a kind Katib runs out of the box).

**The metrics collector is Katib's File collector, JSON format**, reading ``/var/log/katib/metrics.json``, to
which the trainer appends each periodic evaluation as it happens (``evaluation.every_steps``) and the final one
once the job is whole (``colbert-train --metrics-file``, :mod:`trainer.reporting.metrics_file`), each line timestamped.
Why not StdOut: it wraps the container's command in a shell that redirects its output to a file, and scans
every log line with a pattern whose default name class (``[\\w|-]+``) does not take the ``@`` of ``ndcg@10``;
the trainer's own lines hold ``key=value`` text too. JSON lines written by rank 0 are the evaluation's figures
under their own names (the last one exactly ``metrics.json``'s), and the pods' logs stay as they are.

**Every metric's strategy is ``latest``**: a trial's figure is its last line, the final evaluation of the model
it leaves (Katib's default, the best of all lines, would credit a trial with an intermediate figure its final
model does not have). **Early stopping** (``--early-stop median``): ``earlyStopping: {algorithmName:
medianstop}`` with its settings (:mod:`operator_cli.tune.early_stop`); it acts on the intermediate lines, so the
config must evaluate during training (checked before anything is created).
"""

from __future__ import annotations

import math
from typing import Any

from operator_cli import constants as C
from operator_cli.errors import CliError
from operator_cli.jobshape import SweepShape
from operator_cli.kube.kinds.sweeps import SweepKind, plain_value, sweep_state, trial_value
from operator_cli.tune.space import Space

__all__ = ["KatibExperiment"]

METRICS_FILE = "/var/log/katib/metrics.json"
TRIAL_NAME = "trialName"  # the trial parameter that holds the trial's name (its output_dir under a shared claim)
EXPERIMENT_LABEL = "katib.kubeflow.org/experiment"
_ALGORITHMS = {"random": "random", "grid": "grid", "bayesian": "bayesianoptimization"}


def katib_parameter(space: Space) -> dict[str, Any]:
    """One search-space entry: a double with its distribution, an int range, or a list (discrete for finite
    numbers, categorical for anything else).

    >>> from operator_cli.tune.space import parse_space
    >>> katib_parameter(parse_space("training.learning_rate=loguniform(1e-5,2e-4)"))["feasibleSpace"]
    {'min': '1.0e-05', 'max': '0.0002', 'distribution': 'logUniform'}
    """
    if space.kind == "choice":
        numeric = all(_finite_number(v) for v in space.choices)
        values = [trial_value(space.key, v) for v in space.choices]  # each read back exactly by the trial's --set
        kind, feasible = ("discrete" if numeric else "categorical"), {"list": values}
    elif space.kind == "int":
        kind, feasible = "int", {"min": str(space.low), "max": str(space.high)}
    else:
        distribution = "logUniform" if space.kind == "loguniform" else "uniform"
        kind = "double"
        feasible = {"min": plain_value(space.low), "max": plain_value(space.high), "distribution": distribution}
    return {"name": space.name, "parameterType": kind, "feasibleSpace": feasible}


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class KatibExperiment(SweepKind):
    """A Katib Experiment whose trial template is the rendered PyTorchJob."""

    api = "katib"
    group = "kubeflow.org"
    version = "v1beta1"
    plural = "experiments"
    kind = "Experiment"
    product = "Katib"
    install = 'kubectl apply -k "github.com/kubeflow/katib.git/manifests/v1beta1/installs/katib-standalone?ref=v0.19.0"'
    template = "experiment.yaml.j2"
    trial_api = "pytorchjob"

    def check(self, sweep: SweepShape) -> None:
        if sweep.job.api != self.trial_api:
            raise CliError(
                f"--engine katib runs PyTorchJob trials (Katib's own kind); --api {sweep.job.api} is not one",
                hint="drop --api, or use --engine optimizationjob for TrainJob trials",
            )

    def trial_args(self, sweep: SweepShape) -> list[str]:
        args = []
        for space in sweep.params:
            args += ["--set", f"{space.key}=${{trialParameters.{space.name}}}"]
        out = sweep.job.train_config.output_dir.rstrip("/")
        return [*args, "--set", f"output_dir={out}/${{trialParameters.{TRIAL_NAME}}}", "--metrics-file", METRICS_FILE]

    def context(self, sweep: SweepShape, trial: dict[str, Any]) -> dict[str, Any]:
        from trainer.config.schema import METRICS

        meta = {k: v for k, v in trial["metadata"].items() if k in ("labels", "annotations")}  # Katib names it
        trial_spec = {"apiVersion": trial["apiVersion"], "kind": trial["kind"], "metadata": meta, "spec": trial["spec"]}
        settings = [{"name": "random_state", "value": str(sweep.seed)}] if sweep.algorithm != "grid" else []
        additional = [m for m in METRICS if m != sweep.metric]
        return {
            "algorithm": _ALGORITHMS[sweep.algorithm],
            "settings": settings,
            "additional": additional,
            "strategies": [{"name": m, "value": "latest"} for m in (sweep.metric, *additional)],
            "early_stopping": sweep.early_stop.katib() if sweep.early_stop else None,
            "parameters": [katib_parameter(space) for space in sweep.params],
            "trial_spec": trial_spec,
            "trial_name": TRIAL_NAME,
            "metrics_file": METRICS_FILE,
            "primary_labels": {C.OPERATOR_REPLICA_TYPE: "master"},
        }

    def trials(self, cluster: Any, sweep: dict[str, Any]) -> list[dict[str, Any]]:
        """Katib's Trial objects of the Experiment (by its label), with their observation of the objective."""
        name = sweep["metadata"]["name"]
        metric = sweep.get("spec", {}).get("objective", {}).get("objectiveMetricName")
        by_name = {s.name: s.key for s in _spaces(sweep)}
        selector = f"{EXPERIMENT_LABEL}={name}"
        fn = lambda: cluster.custom.list_namespaced_custom_object(  # noqa: E731
            self.group, self.version, cluster.ns, "trials", label_selector=selector
        )
        rows = []
        for t in cluster.items(fn, "Trial"):
            values = {
                by_name.get(p.get("name"), p.get("name")): p.get("value")
                for p in t.get("spec", {}).get("parameterAssignments", [])
            }
            observed = {
                m.get("name"): m.get("latest")
                for m in (t.get("status", {}).get("observation") or {}).get("metrics", [])
            }
            value = observed.get(metric)
            rows.append(
                {
                    "name": t["metadata"]["name"],
                    "values": values,
                    "state": sweep_state(t),
                    "metric": float(value) if _number(value) else None,
                    "seconds": _seconds(t.get("status", {})),
                    "reason": _failure(t),
                }
            )
        return sorted(rows, key=lambda r: r["name"])

    def best_name(self, sweep: dict[str, Any]) -> str | None:
        return (sweep.get("status", {}).get("currentOptimalTrial") or {}).get("bestTrialName") or None


def _spaces(sweep: dict[str, Any]) -> list[Any]:
    """(name, key) of each parameter: the key is in the trial parameter's description."""
    from types import SimpleNamespace

    template = sweep.get("spec", {}).get("trialTemplate", {})
    return [
        SimpleNamespace(name=p.get("reference"), key=p.get("description") or p.get("reference"))
        for p in template.get("trialParameters", [])
        if p.get("name") != TRIAL_NAME
    ]


def _seconds(status: dict[str, Any]) -> float | None:
    """A trial's run time, from its status' start and completion times (None while it runs)."""
    from datetime import datetime

    try:
        start, end = (datetime.fromisoformat(status[k].replace("Z", "+00:00")) for k in ("startTime", "completionTime"))
    except (KeyError, AttributeError, ValueError):
        return None
    return (end - start).total_seconds()


def _number(value: Any) -> bool:
    try:
        float(value)
        return True
    except (TypeError, ValueError):
        return False


def _failure(trial: dict[str, Any]) -> str | None:
    for c in trial.get("status", {}).get("conditions", []) or []:
        if c.get("type") == "Failed" and c.get("status") == "True":
            return (c.get("message") or c.get("reason") or "failed").splitlines()[0][:200]
    return None
