"""``tune``: a sweep whose trials are jobs, on Katib, Trainer's OptimizationJob or locally; ``tune status``.

    colbert-k8s tune --config train.yaml --param training.learning_rate=loguniform(1e-5,2e-4) \\
        --param mine.negatives=choice(1,3) --trials 8 --local --workdir DIR
    colbert-k8s tune ... --dry-run=client -o yaml      (the Experiment and its ConfigMap, as `render` prints a job)
    colbert-k8s tune status NAME [--workdir DIR] [-o json]

``tune`` takes every option of ``submit`` (the trial job's) and the sweep's own (:data:`TUNE_OPTIONS`). Its
input becomes a :class:`operator_cli.tune.spec.SweepSpec`, checked before anything starts; the engine then
renders and creates it (``--engine katib|optimizationjob``) or runs it here (``--local``,
:mod:`operator_cli.tune.local`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from operator_cli.commands.base import (
    Command,
    Group,
    cluster_of,
    cluster_options,
    job_name,
    missing_modules,
    namespace_option,
)
from operator_cli.commands.job import build_spec, job_options
from operator_cli.errors import CliError
from operator_cli.kube.kinds import SWEEPS
from operator_cli.notes import storage_notes
from operator_cli.render import to_yaml
from operator_cli.tune.options import tune_options

__all__ = ["tune_group"]


class _RunByDefault(Group):
    """``tune --config ...`` runs a sweep (``run``, named or not); ``tune status NAME`` is a subcommand."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group("tune", cls=_RunByDefault)
def tune_group() -> None:
    """Tune on your own data: a sweep whose trials are jobs (Katib, Trainer's OptimizationJob, or --local).

    `colbert-k8s tune --config FILE --param KEY=SPACE ...` runs a sweep (`run` may be left out; see
    `colbert-k8s tune run --help`); the best trial's model is staged in tune/NAME/best/ (--local) and exported
    to export.destination with a card naming the sweep."""


@tune_group.command("run", cls=Command)
@job_options
@cluster_options
@tune_options
def run_cmd(**o) -> None:
    """Run a sweep: each trial a job of the given options with the trial's values; the best trial's model exported."""
    from operator_cli.spec import read_config
    from operator_cli.tune.early_stop import EarlyStop
    from operator_cli.tune.space import parse_space
    from operator_cli.tune.spec import SweepSpec, without_export

    engine = "local" if o.pop("local") else o.pop("engine")
    o.pop("engine", None)
    if click.get_current_context().get_parameter_source("api") == click.core.ParameterSource.DEFAULT:
        o["api"] = SWEEPS[engine].trial_api if engine in SWEEPS else o["api"]
    dry_run, output, workdir = o.pop("dry_run"), o.pop("output"), o.pop("workdir")
    sweep_options = {
        k: o.pop(k)
        for k in ("metric", "goal", "trials", "parallel", "algorithm", "seed", "max_failed", "allow_test_split")
    }
    sweep_options["early_stop"] = EarlyStop.parse(o.pop("early_stop"), o.pop("early_stop_setting"))
    spaces = tuple(parse_space(p) for p in o.pop("param"))
    config_text = read_config(o["config"], o.get("overrides", ()))  # --set reaches every trial's config
    # the trials export nothing (the sweep exports the best); the spaces tell this sweep's name from another's
    job = build_spec(o, without_export(config_text), salt=[spaces, sweep_options])
    sweep = SweepSpec(job=job, params=spaces, config_text=config_text, **sweep_options)
    if engine == "local":
        _local(sweep, dry_run, output, Path(workdir))
        return
    kind = SWEEPS[engine]
    objects = kind.render(sweep)
    if kind.experimental:
        click.echo(f"warning: {kind.kind} is experimental: {kind.product}", err=True)
    for line in [*storage_notes(sweep.job), *_kept_nowhere(sweep, kind)]:
        click.echo(line, err=True)
    if sweep.config.export is not None:
        click.echo(
            "note: on a cluster the trials export nothing; `tune status` names the best trial, whose model "
            "is in its output_dir (export.destination is used by --local sweeps)",
            err=True,
        )
    if dry_run:
        click.echo(_dump(objects, output), nl=False)
        return
    cluster = cluster_of(o)
    if not cluster.serves(kind):
        raise CliError(
            f"this cluster does not serve {kind.kind} ({kind.api_version}): {kind.product} is not installed",
            hint=f"{kind.install}, or run the sweep here with --local",
        )
    job = sweep.job
    secrets = sorted({ref.secret for ref in job.secret_env.values()} | set(job.image_pull_secrets))
    cluster.preflight(job.api, secrets, job.pvc, job.runtime)
    for obj in cluster.create_all(objects):
        click.echo(f"created {obj['kind']} {job.namespace}/{obj['metadata']['name']}")
    ns = "" if job.namespace == "default" else f" -n {job.namespace}"
    click.echo(f"next:\n  colbert-k8s tune status {sweep.name}{ns}\n  colbert-k8s delete {sweep.name}{ns}")


def _kept_nowhere(sweep, kind) -> list[str]:
    """The warning for a cluster sweep whose trials write to per-pod emptyDirs: the best model goes with its pod."""
    if sweep.job.claim_name:
        return []  # the trials keep OUTPUT_DIR/<trial>/ on the claim
    if kind.api == "optimizationjob":  # it refuses a claim: its template cannot tell the trials apart
        fix = "use --engine katib with --pvc CLAIM (or --pvc-size), or --local with export.destination"
    else:
        fix = "pass --pvc CLAIM or --pvc-size SIZE (each trial keeps its output_dir on the claim)"
    return [
        f"warning: the best model is kept nowhere: each {kind.kind} trial writes its model to its pod's emptyDir "
        f"/workspace, deleted with the pod, and cluster trials export nothing; {fix}"
    ]


def _dump(objects: list[dict], output: str) -> str:
    if output == "json":
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2) + "\n"
    return to_yaml(objects)


def _local(sweep, dry_run: str | None, output: str, workdir: Path) -> None:
    """``--local``: the plan (dry run), or the sweep run here."""
    from operator_cli.tune.local import check_output_dir

    check_output_dir(sweep.job.train_config.output_dir)
    if dry_run:
        plan = {
            "sweep": sweep.name,
            "engine": "local",
            "metric": sweep.metric,
            "goal": sweep.goal,
            "trials": [{"name": t.name, "values": t.values} for t in sweep.plan()],
        }
        click.echo(json.dumps(plan, indent=2) if output == "json" else to_yaml([plan]), nl=output == "json")
        return
    missing = missing_modules("torch", "pylate")
    if missing:
        raise CliError(
            f"`tune --local` runs the trainer on this machine, but {', '.join(missing)} is not installed",
            hint="pip install -e '.[train]' (or run scripts/setup.sh train)",
        )
    from operator_cli.commands.job import _writable_dir
    from operator_cli.tune.best import preflight
    from operator_cli.tune.local import run_sweep

    sweep.plan()  # an algorithm the local engine lacks: one line before anything is written
    preflight(sweep)
    sys.exit(run_sweep(sweep, _writable_dir(workdir), click.echo))


@tune_group.command("status", cls=Command)
@click.argument("name")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    help="A local sweep: the --workdir it ran in. Default: the current directory when it holds tune/NAME/, else "
    "the cluster.",
)
@namespace_option
@cluster_options
@click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "json", "yaml"]),
    default="table",
    show_default=True,
    help="json/yaml: the same fields as the table, for scripts.",
)
def status_cmd(name: str, workdir: str | None, output: str, **o) -> None:
    """Every trial's values, state, metric and time, and the best so far."""
    from operator_cli.tune.local import sweep_root
    from operator_cli.tune.record import SWEEP_FILE, local_record, record_text

    name = job_name(name)
    if workdir is None and (sweep_root(Path.cwd(), name) / SWEEP_FILE).is_file():
        workdir = "."  # a local sweep run here (`tune --local` defaults --workdir to .)
    if workdir is not None:
        record = local_record(sweep_root(Path(workdir).resolve(), name))
    else:
        from operator_cli.tune.cluster import sweep_record

        record = sweep_record(cluster_of(o), name)
    click.echo(record_text(record, output))
