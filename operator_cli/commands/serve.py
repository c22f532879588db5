"""``serve``: a trained model answers search and rerank requests, on this machine or on KServe.

    colbert-k8s serve --local s3://models/run-1/ [--port 8080] [--host 127.0.0.1] [--exact]
        [--onnx [int8] | --precision bf16]
    colbert-k8s serve render NAME|URI [--exact] [--onnx [int8] | --precision bf16] [-o yaml|json]
    colbert-k8s serve apply NAME|URI [--exact] [--onnx [int8] | --precision bf16]
    colbert-k8s serve list                              colbert-k8s serve delete NAME

``--local`` runs the very predictor an InferenceService runs (``python -m trainer.serve``, KServe's model server)
in the interpreter that has kserve: this one if it does, else ``.venv-serve`` (``scripts/setup.sh`` creates it:
kserve pins python-dateutil<3, which this CLI's kubernetes client refuses), listening on 127.0.0.1 unless
``--host`` names another address. Importing this module imports neither torch nor kserve.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import click

from operator_cli import constants as C
from operator_cli import rules
from operator_cli.commands.base import (
    Command,
    Group,
    click_option,
    cluster_of,
    cluster_options,
    default_namespace,
    namespace_option,
)
from operator_cli.errors import CliError
from operator_cli.kube.kinds.inferenceservice import ONNX_FORMS, PRECISIONS
from operator_cli.values import shown

__all__ = ["serve_group", "serve_python"]

_REPO = Path(__file__).resolve().parents[2]


def serve_python() -> str:
    """The interpreter that has kserve: ``$COLBERT_K8S_SERVE_PYTHON``, this one, or the checkout's .venv-serve."""
    if chosen := os.environ.get("COLBERT_K8S_SERVE_PYTHON"):
        return chosen
    if importlib.util.find_spec("kserve") is not None:
        return sys.executable
    for root in (Path.cwd(), _REPO):
        if (candidate := root / ".venv-serve" / "bin" / "python").is_file():
            return str(candidate)
    raise CliError(
        "kserve is not installed here, and no .venv-serve was found",
        hint="run scripts/setup.sh train (it creates .venv-serve), or set COLBERT_K8S_SERVE_PYTHON to a python "
        "with pip install -r requirements-serve.txt",
    )


_PRECISION_HELP = (
    "With --local: the PyTorch encoder's precision; bf16 runs it under bfloat16 autocast, about half the time on a "
    "GPU or a CPU with AVX512-BF16 (default: fp32)."
)
_LOCAL_ONLY = "--onnx, --allow-int8-loss and --precision go with --local, or after render or apply"
_ONNX_HINT = "serve render NAME|URI --onnx [fp32|int8] (or apply), or serve --local URI --onnx [fp32|int8]"


class _GroupOnnx(click.Choice):
    """The group's ``--onnx`` form; a subcommand's name in its place (``serve --onnx render X``) is the option
    given before the subcommand it belongs after."""

    def convert(self, value, param, ctx):
        if value in ("render", "apply", "list", "delete"):
            raise CliError(_LOCAL_ONLY, hint=_ONNX_HINT)
        return super().convert(value, param, ctx)


@click.group("serve", cls=Group, invoke_without_command=True)
@click.option("--local", "uri", metavar="URI", help="Serve this export (s3://..., a local copy) or output_dir here.")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="With --local: the address to listen on (0.0.0.0: every interface, reachable from the network).",
)
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True, help="With --local.")
@click.option("--exact", is_flag=True, help="Search by exact MaxSim over the stored corpus embeddings, not PLAID.")
@click.option(
    "--onnx",
    type=_GroupOnnx(ONNX_FORMS),
    is_flag=False,
    flag_value="fp32",
    help="With --local: encode with the model's ONNX export (colbert-k8s export-onnx) on the CPU; alone: fp32.",
)
@click.option("--allow-int8-loss", is_flag=True, help="Serve --onnx int8 though it loses more nDCG@10 than allowed.")
@click.option("--precision", type=click.Choice(PRECISIONS), help=_PRECISION_HELP)
@click.option("--model-name", default="colbert", show_default=True, help="The model's name in the URLs.")
@click.pass_context
def serve_group(
    ctx: click.Context,
    uri: str | None,
    host: str,
    port: int,
    exact: bool,
    onnx: str | None,
    allow_int8_loss: bool,
    precision: str | None,
    model_name: str,
) -> None:
    """Serve a trained model: search (top-k ids) and rerank (MaxSim scores), KServe v1 and v2 protocols."""
    if ctx.invoked_subcommand is not None:
        if onnx or allow_int8_loss or precision:
            raise CliError(_LOCAL_ONLY, hint=_ONNX_HINT)
        if uri:
            raise CliError(
                "--local serves here; it does not go with a subcommand", hint="drop --local or the subcommand"
            )
        return
    if not uri:
        raise CliError(
            "give --local URI, or a subcommand (render, apply, list, delete)", hint="see `colbert-k8s serve --help`"
        )
    _check_host(host)
    python = serve_python()
    cmd = [python, "-m", "trainer.serve", uri, "--host", host, "--http-port", str(port), "--model-name", model_name]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_REPO), os.environ.get("PYTHONPATH")]))}
    cmd += (["--exact"] if exact else []) + (["--onnx", onnx] if onnx else [])
    cmd += ["--allow-int8-loss"] if allow_int8_loss else []
    cmd += ["--precision", precision] if precision else []
    os.execve(python, cmd, env)  # the server is this process: Ctrl-C stops it


def _check_host(host: str) -> None:
    """--host: an IP address or a host name (uvicorn would fail on anything else with a traceback)."""
    import ipaddress

    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    if not rules.full("dns1123", host.lower()):
        raise CliError(
            f"--host must be an IP address or a host name, got {shown(host)}",
            hint="--host 127.0.0.1 (this machine only, the default) or --host 0.0.0.0 (every interface)",
        )


def _spec_options(fn):
    """What shapes the InferenceService, for render and apply."""
    for decorator in reversed(
        [
            click.argument("target", metavar="NAME|URI"),
            click.option(
                "--name",
                help="The InferenceService's (and the model's) name; default: the job's, or the URI's last folder.",
            ),
            namespace_option,
            click.option("--image", default=C.DEFAULT_IMAGE, show_default=True, help="The colbert-train image."),
            click.option("--gpus", type=int, default=0, show_default=True, help="GPUs a replica (0: CPU)."),
            click.option("--cpu", default="2", show_default=True, help="CPUs a replica (requests = limits)."),
            click.option("--memory", default="8Gi", show_default=True, help="Memory a replica (requests = limits)."),
            click.option(
                "--ephemeral-storage",
                default="10Gi",
                show_default=True,
                help="Node disk a replica asks for (a request): the export in /mnt/models, /tmp, logs.",
            ),
            click.option("--exact", is_flag=True, help="Search by exact MaxSim over the stored corpus embeddings."),
            click.option(
                "--onnx",
                type=click.Choice(ONNX_FORMS),
                is_flag=False,
                flag_value="fp32",
                help="Encode with the model's ONNX export (colbert-k8s export-onnx) on the CPU; alone: fp32. "
                "With --gpus, the GPU runs the search only.",
            ),
            click.option(
                "--allow-int8-loss", is_flag=True, help="Serve --onnx int8 though it loses more nDCG@10 than allowed."
            ),
            click.option(
                "--precision",
                type=click.Choice(PRECISIONS),
                default="fp32",
                show_default=True,
                help="The PyTorch encoder's precision; bf16 runs it under bfloat16 autocast, about half the time on "
                "a GPU or a CPU node with AVX512-BF16.",
            ),
            click.option(
                "--min-replicas", type=int, default=1, show_default=True, help="Replicas at least (0: none while idle)."
            ),
            click.option(
                "--max-replicas",
                type=int,
                default=1,
                show_default=True,
                help="Replicas at most (KServe scales between).",
            ),
            click.option("--max-batch-size", type=int, help="KServe's batcher: group concurrent requests (1-64)."),
            click.option("--service-account", help="The ServiceAccount whose Secrets KServe fetches the export with."),
            click.option(
                "--secret-env",
                multiple=True,
                metavar="VAR=SECRET/KEY",
                help="An environment variable from a Secret's key (a reference; repeatable).",
            ),
            click.option(
                "--runtime",
                default=C.SERVE_RUNTIME,
                show_default=True,
                help="The ClusterServingRuntime (apply creates colbert-k8s's when missing).",
            ),
            *_pod_options(),
            cluster_options,
        ]
    ):
        fn = decorator(fn)
    return fn


def _pod_options() -> list:
    """The job options a served model's pod takes too (image pull secrets, node selector, tolerations, labels,
    annotations): the job commands' own declarations."""
    from operator_cli.kube.kinds.inferenceservice import POD_OPTIONS

    return [click_option(option, {}) for option in POD_OPTIONS]


def _default_name(uri: str) -> str:
    """The URI's last folder as a DNS-1035 label: s3://models/Run_1/ -> run-1."""
    last = [p for p in re.split(r"[/:]", uri) if p][-1] if uri.strip("/:") else "colbert"
    name = re.sub(r"[^a-z0-9-]+", "-", last.lower()).strip("-")
    name = name if name[:1].isalpha() else f"colbert-{name}".rstrip("-")
    return name[:45].rstrip("-")


def _build(o: dict):
    """(ClusterServingRuntime, InferenceService) the flags describe; NAME reads the job's export from its config."""
    from operator_cli.commands.register import job_export
    from operator_cli.kube.kinds.inferenceservice import POD_OPTIONS, InferenceService, ServeSpec, ServingRuntime
    from operator_cli.values import parse_secret_envs

    target = o["target"]
    remote = "://" in target
    uri = target if remote else job_export(o, target)[0]
    spec = ServeSpec(
        name=o["name"] or (_default_name(uri) if remote else target),
        namespace=o["namespace"] if o["namespace"] is not None else default_namespace(o),
        storage_uri=uri,
        image=o["image"],
        gpus=o["gpus"],
        cpu=o["cpu"],
        memory=o["memory"],
        exact=o["exact"],
        onnx=o["onnx"],
        allow_int8_loss=o["allow_int8_loss"],
        precision=o["precision"],
        min_replicas=o["min_replicas"],
        max_replicas=o["max_replicas"],
        max_batch_size=o["max_batch_size"],
        service_account=o["service_account"],
        secret_env=parse_secret_envs(o["secret_env"]),
        runtime=o["runtime"],
        ephemeral_storage=o["ephemeral_storage"],
        **{opt.spec_field: opt.parse(o[opt.key]) if opt.parse else o[opt.key] for opt in POD_OPTIONS},
    )
    if spec.onnx and spec.gpus:
        click.echo("note: --onnx encodes on the CPU; the GPU runs the search (PLAID or --exact) only", err=True)
    return ServingRuntime().render(spec), InferenceService().render(spec)


@serve_group.command("render", cls=Command)
@_spec_options
@click.option(
    "-o", "--output", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True, help="The format."
)
def render_cmd(output: str, **o) -> None:
    """Print the ClusterServingRuntime and the InferenceService that `serve apply` would create."""
    from operator_cli.render import to_yaml

    objects = list(_build(o))
    click.echo(json.dumps(objects, indent=2) if output == "json" else to_yaml(objects), nl=output == "json")


@serve_group.command("apply", cls=Command)
@_spec_options
def apply_cmd(**o) -> None:
    """Create the InferenceService (and the ClusterServingRuntime, when the cluster has none of that name)."""
    from operator_cli.kube.served import apply

    runtime, isvc = _build(o)
    for what in apply(cluster_of(o), runtime, isvc):
        click.echo(f"created {what}")
    name = isvc["metadata"]["name"]
    click.echo(f"ready when `kubectl get inferenceservice {name}` says so; then POST /v1/models/{name}:predict")


@serve_group.command("list", cls=Command)
@namespace_option
@click.option("-A", "--all-namespaces", is_flag=True, help="Every namespace's served models.")
@cluster_options
def list_cmd(all_namespaces: bool, **o) -> None:
    """This tool's served models: name, readiness, URL and the export each serves."""
    from operator_cli import show
    from operator_cli.kube.kinds.inferenceservice import InferenceService
    from operator_cli.kube.served import list_served

    cluster = cluster_of(o)
    items = list_served(cluster, all_namespaces)
    if not items:
        click.echo("no served models" + ("" if all_namespaces else f" in namespace {cluster.ns}"))
        return
    rows = [
        [
            i["metadata"].get("namespace", ""),
            i["metadata"]["name"],
            InferenceService.ready(i),
            InferenceService.url(i),
            (((i.get("spec") or {}).get("predictor") or {}).get("model") or {}).get("storageUri", ""),
        ]
        for i in items
    ]
    click.echo(show.table(["NAMESPACE", "NAME", "READY", "URL", "EXPORT"], rows))


@serve_group.command("delete", cls=Command)
@click.argument("name")
@namespace_option
@cluster_options
def delete_cmd(name: str, **o) -> None:
    """Remove a served model this tool created (the ClusterServingRuntime stays: others may name it)."""
    from operator_cli.commands.base import job_name
    from operator_cli.kube.served import delete

    click.echo(f"deleted {delete(cluster_of(o), job_name(name))}")
