"""/workspace here: ``--workdir`` itself for a PVC (shared by every pod), or one directory per pod for an emptyDir."""

from __future__ import annotations

import shutil
from pathlib import Path

import click

from operator_cli.errors import CliError
from operator_cli.podplan import PodPlan
from operator_cli.spec import parse_training_config

__all__ = ["announce_storage", "pod_workspace", "prepare_pod_workspaces", "shares_workspace"]


def shares_workspace(plan: PodPlan) -> bool:
    """True when /workspace is a PersistentVolumeClaim (one volume for all pods), False for an emptyDir."""
    workspace = next((v for v in plan.pod_spec.get("volumes", []) if v["name"] == "workspace"), {})
    return "persistentVolumeClaim" in workspace


def pod_workspace(workdir: Path, host: str) -> Path:
    """Where an emptyDir-backed pod's /workspace lives here."""
    return workdir / "pods" / host


def announce_storage(plan: PodPlan, config_text: str, workdir: Path) -> Path:
    """Lay out /workspace as the cluster would and say how; returns the master pod's workspace."""
    if shares_workspace(plan):
        click.echo(f"local: /workspace is a PVC shared by every replica: {workdir}", err=True)
        return workdir
    copied = prepare_pod_workspaces(plan, config_text, workdir)
    click.echo(
        f"local: each replica has its own /workspace (an emptyDir): {pod_workspace(workdir, '')}"
        f"{{{','.join(plan.hosts)}}}; copied into each from {workdir}: {', '.join(copied) or 'nothing'}",
        err=True,
    )
    return pod_workspace(workdir, plan.hosts[0])


_POD_MARK = ".colbert-k8s-pod"


def prepare_pod_workspaces(plan: PodPlan, config_text: str, workdir: Path) -> list[str]:
    """Fresh per-pod workspaces (emptyDirs) holding the inputs the config names; returns what was copied.

    Only directories this command made (they hold a marker file) are ever emptied."""
    inputs = _relative_inputs(config_text, workdir)
    for host in plan.hosts:
        ws = pod_workspace(workdir, host)
        if ws.exists():
            if not (ws / _POD_MARK).is_file():
                raise CliError(
                    f"{ws} exists and was not made by `colbert-k8s local`; it is left as it is",
                    hint="move it away, or pass another --workdir",
                )
            shutil.rmtree(ws)
        ws.mkdir(parents=True)
        (ws / _POD_MARK).write_text("an emptyDir stand-in made by `colbert-k8s local`; emptied on its next run\n")
        for rel in inputs:
            src, dst = workdir / rel, ws / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
    return inputs


def _relative_inputs(config_text: str, workdir: Path) -> list[str]:
    """Relative paths in the config that exist under the workdir: the job's inputs."""
    cfg = parse_training_config(config_text)
    candidates = [cfg.data.train.path, cfg.data.eval_beir, cfg.model.name_or_path]
    return [p for p in candidates if p and not Path(p).is_absolute() and (workdir / p).exists()]
