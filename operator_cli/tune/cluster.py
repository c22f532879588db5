"""A sweep on a cluster: find it, list it beside the jobs, read its trials, delete it and what ``tune`` made for it.

A sweep object is found among the sweep kinds the cluster serves (:data:`operator_cli.kube.kinds.SWEEPS`), and
touched only when it carries this tool's labels, as a job is. Deleting it deletes in the foreground, so its
controller's trials and their jobs go first; then the ConfigMap and the claim ``--pvc-size`` created, each only
if this tool made it for this sweep.
"""

from __future__ import annotations

from typing import Any

import operator_cli.kube.names as names
from operator_cli import constants as C
from operator_cli.errors import CliError
from operator_cli.kube.cluster import Cluster
from operator_cli.kube.kinds import SWEEPS, SweepKind, job_state, sweep_named
from operator_cli.objects import KubeObject
from operator_cli.tune.record import best_of

__all__ = ["delete_sweep", "get_sweep", "list_sweeps", "sweep_record"]


def _ours(obj: KubeObject, name: str | None = None) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    mine = labels.get(C.LABEL_MANAGED_BY) == C.MANAGED_BY
    return mine and (name is None or labels.get(C.LABEL_INSTANCE) == name)


def get_sweep(cluster: Cluster, name: str) -> tuple[SweepKind, KubeObject]:
    """The sweep called ``name`` (of whichever kind), if this tool created it; else one line, exit 1."""
    for kind in SWEEPS.values():
        try:
            obj = cluster.request(lambda k=kind: k.get(cluster.custom, cluster.ns, name), "get", kind.kind, name)
        except CliError as e:
            if e.status != 404:
                raise
            continue
        if not _ours(obj, name):
            raise CliError(
                f"{kind.kind} {cluster.ns}/{name} was not created by colbert-k8s; not touching it",
                hint="use kubectl for sweeps other tools manage",
                exit_code=1,
            )
        obj.setdefault("kind", kind.kind)
        return kind, obj
    raise CliError(
        f"no sweep {cluster.ns}/{name} ({' or '.join(k.kind for k in SWEEPS.values())})",
        hint="see `colbert-k8s list`",
        exit_code=1,
        status=404,
    )


def list_sweeps(cluster: Cluster, all_namespaces: bool = False) -> list[KubeObject]:
    """This tool's sweeps of every kind the cluster serves."""
    selector = f"{C.LABEL_MANAGED_BY}={C.MANAGED_BY}"
    namespace = None if all_namespaces else cluster.ns
    found = []
    for kind in SWEEPS.values():
        fn = lambda k=kind: k.list(cluster.custom, namespace, selector)  # noqa: E731
        for obj in cluster.items(fn, kind.kind, namespace=None if all_namespaces else ""):
            if isinstance(obj, dict) and _ours(obj):
                obj.setdefault("kind", kind.kind)
                found.append(obj)
    return found


def list_row(obj: KubeObject) -> dict[str, Any]:
    """A sweep as ``list`` shows it beside the jobs: its trials' shape is its template's."""
    meta = obj["metadata"]
    spec = obj.get("spec", {})
    trials = spec.get("maxTrialCount") or spec.get("numTrials")
    return {
        "namespace": meta.get("namespace", ""),
        "name": meta["name"],
        "kind": obj["kind"],
        "state": job_state(obj),
        "nodes": f"{trials} trials",
        "gpusPerNode": "",
        "created": meta.get("creationTimestamp"),
    }


def sweep_record(cluster: Cluster, name: str) -> dict[str, Any]:
    """``tune status NAME`` for a sweep on the cluster: the same record as a local sweep's."""
    kind, obj = get_sweep(cluster, name)
    spec = obj.get("spec", {})
    metric, goal = _objective(kind, spec)
    trials = kind.trials(cluster, obj)
    best = best_of(trials, goal)
    named = kind.best_name(obj)
    if best is None and named:  # the controller's word, where the trials' figures cannot be read
        best = next((t for t in trials if t["name"] == named), None)
    space = {p.get("description") or p.get("name"): p.get("name") for p in _trial_parameters(spec)}
    return {
        "name": name,
        "namespace": cluster.ns,
        "engine": kind.api,
        "kind": kind.kind,
        "state": job_state(obj),
        "metric": metric,
        "goal": goal,
        "algorithm": _algorithm(spec),
        "space": space,
        "trials": trials,
        "best": best,
    }


def _objective(kind: SweepKind, spec: dict[str, Any]) -> tuple[str, str]:
    if "objective" in spec:
        o = spec["objective"]
        return o.get("objectiveMetricName", ""), "max" if o.get("type") == "maximize" else "min"
    o = (spec.get("objectives") or [{}])[0]
    return o.get("metric", ""), "max" if o.get("direction") == "Maximize" else "min"


def _algorithm(spec: dict[str, Any]) -> str:
    if "algorithm" in spec:
        return spec["algorithm"].get("algorithmName", "")
    return next(iter(spec.get("searchAlgorithm") or {"random": {}}))


def _trial_parameters(spec: dict[str, Any]) -> list[dict[str, Any]]:
    if "trialTemplate" in spec:
        return [p for p in spec["trialTemplate"].get("trialParameters", []) if p.get("reference", "")[:1] != "$"]
    return [{"name": p.get("name")} for p in spec.get("parameters", [])]


def delete_sweep(cluster: Cluster, name: str, keep_storage: bool) -> list[str]:
    """Remove the sweep (its trials and their jobs with it) and what ``tune`` created for it; returns what went."""
    kind, _ = get_sweep(cluster, name)
    extra = [("ConfigMap", names.config_map(name))]
    if not keep_storage:
        extra.append(("PersistentVolumeClaim", names.created_claim(name)))
    found = {key: cluster.object(*key) for key in extra}
    if not cluster.delete(kind.kind, name):
        raise CliError(f"{kind.kind} {cluster.ns}/{name} not found", hint="see `colbert-k8s list`", exit_code=1)
    removed = [f"{kind.kind} {name} (and its trials)"]
    for (what, obj_name), obj in found.items():
        if obj is None:
            continue
        if not _ours(obj, name):
            cluster.skipped.append(f"{what} {obj_name} (not created by colbert-k8s for {name}; left alone)")
            continue
        if cluster.delete(what, obj_name) or cluster.object(what, obj_name) is None:
            removed.append(f"{what} {obj_name}")
    return removed


def is_sweep_kind(kind: str) -> bool:
    return sweep_named(kind) is not None
