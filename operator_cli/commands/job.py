"""``render``, ``submit`` and ``local``: the job's options become a validated :class:`JobSpec`, the spec becomes
objects (:func:`operator_cli.render.render`), and ``submit`` sends exactly those objects.

The options are :data:`operator_cli.spec.JOB_OPTIONS`, turned into click options by :func:`job_options`;
``-o`` is a format (yaml, json), as kubectl's, and ``render -d DIR`` writes one file per object.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from operator_cli.commands.base import (
    Command,
    click_option,
    cluster_of,
    cluster_options,
    default_namespace,
    missing_modules,
)
from operator_cli.durations import Duration
from operator_cli.errors import CliError
from operator_cli.follow import wait_for_job
from operator_cli.kube.runtime import dry_run_note, known_runtime, runtime_or_stock
from operator_cli.notes import storage_notes
from operator_cli.render import render, to_yaml
from operator_cli.spec import JOB_OPTIONS, JobSpec, read_config
from operator_cli.values import derived_name

__all__ = ["build_spec", "job_options", "local_cmd", "render_cmd", "submit_cmd"]

FORMATS = ("yaml", "json")


SET_HELP = (
    "Change one key of the --config file (repeatable), checked against its schema: a dotted key and a "
    "YAML value, e.g. --set training.max_steps=100 --set data.train.path=s3://bucket/pairs.jsonl."
)


def job_options(fn):
    """The options shared by render, submit and local: everything that shapes the job (JOB_OPTIONS), and
    ``--set`` beside ``--config``, whose text it changes."""
    defaults = JobSpec.defaults()
    for option in reversed(JOB_OPTIONS):  # the last decorator applied is the first option listed
        if option.key == "config":
            fn = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=SET_HELP)(fn)
        fn = click_option(option, defaults)(fn)
    return fn


def build_spec(o: dict, config_text: str | None = None, salt: Any = None) -> JobSpec:
    """Options -> JobSpec: each option's value through its parser; the defaults that depend on others.
    ``config_text``: the config to use instead of ``--config``'s (``tune``'s trials: the file without export);
    ``salt``: more that tells this job from another in its derived name (``tune``'s spaces)."""
    if o["api"] == "auto":
        raise CliError("--api auto asks the cluster which API it serves: use it with submit, or pick one")
    values = {
        opt.spec_field: opt.parse(o[opt.key]) if opt.parse and o[opt.key] is not None else o[opt.key]
        for opt in JOB_OPTIONS
        if opt.key != "config"
    }
    defaults = JobSpec.defaults()
    elastic = values["elastic"]
    if values["nodes"] is None:
        values["nodes"] = elastic[1] if elastic else defaults["nodes"]
    values["namespace"] = values["namespace"] if values["namespace"] is not None else default_namespace(o)
    values["runtime"] = values["runtime"] or defaults["runtime"]
    if config_text is None:
        config_text = read_config(o["config"], o.get("overrides", ()))
    if values["name"] is None:
        values["name"] = derived_name(config_text, {**values, "salt": salt})
    return JobSpec(config_text=config_text, **values)


def scale_line(spec: JobSpec) -> str:
    """The nodes, then the trainer's own scale line (``trainer.scale.Scale``), word for word."""
    from trainer.scale import job_scale  # pydantic: kept out of the CLI's import

    unit = "GPU" if spec.gpus_per_node else "CPU process"
    layout = f"{spec.nodes} node(s) x {spec.nproc_per_node} {unit}(s)"
    if spec.elastic:
        layout += f", elastic {spec.elastic[0]}..{spec.elastic[1]} node(s)"
    return f"{layout}; {job_scale(spec.train_config, spec.world_size).line()}"


def _format(output: str) -> str:
    """``-o`` is a format, as kubectl's: yaml or json (``render -o DIR`` of 0.2 ended in 0.4: ``-d DIR``)."""
    if output not in FORMATS:
        hint = "-d/--output-dir DIR writes one file per object" if output not in ("wide", "name") else None
        raise CliError(
            f"-o must be one of {', '.join(FORMATS)}, got {output!r}",
            hint=hint or "render prints whole objects; `colbert-k8s list` is the table",
        )
    return output


@click.command("render", cls=Command)
@job_options
@click.option(
    "-o",
    "--output",
    default="yaml",
    show_default=True,
    metavar="FORMAT",
    help="yaml or json: the objects on stdout (as kubectl -o).",
)
@click.option("-d", "--output-dir", type=click.Path(file_okay=False), help="Write one file per object here instead.")
def render_cmd(output: str, output_dir: str | None, **o) -> None:
    """Print the manifests the job consists of (the same bytes as `submit --dry-run`)."""
    output = _format(output)
    spec = build_spec(o)
    objects = render(spec)
    click.echo(f"scale: {scale_line(spec)}", err=True)
    for line in storage_notes(spec):
        click.echo(line, err=True)
    dump = (
        (
            lambda objs: (
                json.dumps(objs[0] if len(objs) == 1 else {"apiVersion": "v1", "kind": "List", "items": objs}, indent=2)
                + "\n"
            )
        )
        if output == "json"
        else to_yaml
    )
    if not output_dir:
        click.echo(dump(objects), nl=False)
        return
    out = Path(output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for obj in objects:
            path = out / f"{obj['kind'].lower()}-{obj['metadata']['name']}.{output}"
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(dump([obj]))
            tmp.replace(path)
            click.echo(f"wrote {path}", err=True)
    except OSError as e:
        raise CliError(
            f"-d {output_dir}: cannot write there ({e.strerror or type(e).__name__})",
            hint="pass a directory you can write to",
        ) from None


@click.command("submit", cls=Command)
@job_options
@cluster_options
@click.option(
    "--dry-run",
    type=click.Choice(["none", "client", "server"]),
    is_flag=False,
    flag_value="client",
    default="none",
    help="client: print exactly the objects that would be sent, and stop; server: send "
    "them with dryRun=All (the API server admits and defaults them, stores nothing) and print its answer.",
)
@click.option(
    "--suspend",
    is_flag=True,
    help="Create the job suspended (no pods), e.g. to `colbert-k8s upload` data "
    "onto its new claim first; `colbert-k8s resume NAME` starts it.",
)
@click.option("--wait", is_flag=True, help="Follow the job until it succeeds (exit 0) or fails (exit 1).")
@click.option(
    "--timeout",
    type=Duration(low=1, whole=False),
    help="With --wait: give up after this long, e.g. 10m or 2h (exit 1; the job keeps running).",
)
@click.option("--poll-interval", default=10.0, show_default=True, type=float, hidden=True)
def submit_cmd(dry_run: str, suspend: bool, wait: bool, timeout: float | None, poll_interval: float, **o) -> None:
    """Validate, check the cluster, create the job, and print what to run next."""
    if timeout is not None and not wait:
        raise CliError("--timeout applies to --wait; add --wait or drop --timeout")
    if wait and suspend:
        raise CliError("--wait would follow a suspended job that never starts", hint="resume it, then wait on it")
    cluster = None
    if o["api"] == "auto":  # the one case where even --dry-run=client asks the cluster (read-only)
        cluster = cluster_of(o)
        o["api"] = cluster.detect_api()
        click.echo(f"api: auto -> {o['api']} (what this cluster serves; Trainer v2 preferred)", err=True)
    spec = build_spec(o)
    objects = suspended(spec, render(spec)) if suspend else render(spec)
    for line in storage_notes(spec, suspend):
        click.echo(line, err=True)
    runtime_default = spec.kind.uses_runtime and o["runtime"] is None
    if dry_run == "client":
        if runtime_default:
            click.echo(dry_run_note(spec.runtime), err=True)
        click.echo(to_yaml(objects), nl=False)
        return
    cluster = cluster or cluster_of(o)
    if runtime_default:  # this tool's runtime where the cluster has it, else the stock one, and what that costs
        runtime, warning = runtime_or_stock(cluster, spec.runtime)
        if warning:
            click.echo(f"warning: {warning}", err=True)
            spec = dataclasses.replace(spec, runtime=runtime)
            objects = suspended(spec, render(spec)) if suspend else render(spec)
    secrets = sorted({ref.secret for ref in spec.secret_env.values()} | set(spec.image_pull_secrets))
    cluster.preflight(spec.api, secrets, spec.pvc, spec.runtime)
    if dry_run == "server":  # what the API server would store, as TorchX's dry run: nothing is created
        click.echo(to_yaml(cluster.create_all(objects, dry_run=True)), nl=False)
        return
    for obj in cluster.create_all(objects):
        click.echo(f"created {obj['kind']} {spec.namespace}/{obj['metadata']['name']}")
    click.echo(f"scale: {scale_line(spec)}")
    ns = "" if spec.namespace == "default" else f" -n {spec.namespace}"
    first = f"  colbert-k8s upload {spec.name}{ns} LOCAL_PATH [DEST]\n  colbert-k8s resume {spec.name}{ns}\n"
    click.echo(
        f"next:\n{first if suspend else ''}  colbert-k8s status {spec.name}{ns}\n"
        f"  colbert-k8s logs {spec.name}{ns} -f --all\n  colbert-k8s delete {spec.name}{ns}"
    )
    if wait:
        sys.exit(wait_for_job(cluster, spec.name, poll_interval, timeout, click.echo))


def suspended(spec: JobSpec, objects: list[dict]) -> list[dict]:
    """The objects with the job created suspended (its kind's own field: PyTorchJob ``runPolicy.suspend``,
    TrainJob ``spec.suspend``), as ``colbert-k8s suspend`` would patch it."""
    patch = spec.kind.suspend_patch(True)
    job = objects[-1]
    for key, value in patch.items():
        job["spec"][key] = {**job["spec"].get(key, {}), **value} if isinstance(value, dict) else value
    return objects


@click.command("local", cls=Command)
@job_options
@click.option(
    "--workdir",
    default=".",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Local stand-in for the /workspace volume (the PVC): relative paths in the config resolve here.",
)
@click.option("--isolate-network", is_flag=True, help="Each replica in its own network namespace (root, Linux).")
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Every line the replicas print, every rank's, progress bars and "
    "JSON progress included (default: rank 0's lines, other ranks' warnings and errors).",
)
def local_cmd(workdir: str, isolate_network: bool, verbose: bool, **o) -> None:
    """Run the rendered job on this machine: one process group per replica, operator env, restarts."""
    missing = missing_modules("torch", "pylate")
    if missing:
        raise CliError(
            f"`local` runs the trainer on this machine, but {', '.join(missing)} is not installed",
            hint="pip install -e '.[train]' (or run scripts/setup.sh train)",
        )
    from operator_cli.local import run_local  # the replay: subprocesses, network namespaces, the trainer's config

    spec = build_spec(o)
    click.echo(f"scale: {scale_line(spec)}", err=True)
    objects = render(spec)
    if spec.kind.uses_runtime:  # its restarts are its runtime's: replay the runtime's failure policy
        objects += [r for r in [known_runtime(spec.runtime, spec.image)] if r]
    sys.exit(run_local(objects, _writable_dir(Path(workdir)), isolate_network=isolate_network, verbose=verbose))


def _writable_dir(path: Path) -> Path:
    """--workdir, created if need be: a place the replicas can write, or one line saying why not."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".colbert-k8s-probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise CliError(
            f"--workdir {path} is not a directory this user can write ({e.strerror})",
            hint="pass a writable directory (it stands for the job's /workspace volume)",
        ) from None
    return path
