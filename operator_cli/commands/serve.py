"""``serve``: a trained model answers search and rerank requests, on this machine or on KServe.

    colbert-k8s serve --local s3://models/run-1/ [--port 8080] [--exact]   (the predictor, here)
    colbert-k8s serve render NAME|URI [-o yaml|json]    colbert-k8s serve apply NAME|URI
    colbert-k8s serve list                              colbert-k8s serve delete NAME

``--local`` runs the very predictor an InferenceService runs (``python -m trainer.serve``, KServe's model server)
in the interpreter that has kserve: this one if it does, else ``.venv-serve`` (``scripts/setup.sh`` creates it:
kserve pins python-dateutil<3, which this CLI's kubernetes client refuses). Importing this module imports
neither torch nor kserve.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import click

from operator_cli.commands.base import Group
from operator_cli.errors import CliError

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


@click.group("serve", cls=Group, invoke_without_command=True)
@click.option("--local", "uri", metavar="URI", help="Serve this export (s3://..., a local copy) or output_dir here.")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True, help="With --local.")
@click.option("--exact", is_flag=True, help="Search by exact MaxSim over the stored corpus embeddings, not PLAID.")
@click.option("--model-name", default="colbert", show_default=True, help="The model's name in the URLs.")
@click.pass_context
def serve_group(ctx: click.Context, uri: str | None, port: int, exact: bool, model_name: str) -> None:
    """Serve a trained model: search (top-k ids) and rerank (MaxSim scores), KServe v1 and v2 protocols."""
    if ctx.invoked_subcommand is not None:
        if uri:
            raise CliError(
                "--local serves here; it does not go with a subcommand", hint="drop --local or the subcommand"
            )
        return
    if not uri:
        raise CliError(
            "give --local URI, or a subcommand (render, apply, list, delete)", hint="see `colbert-k8s serve --help`"
        )
    python = serve_python()
    cmd = [python, "-m", "trainer.serve", uri, "--http-port", str(port), "--model-name", model_name]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_REPO), os.environ.get("PYTHONPATH")]))}
    os.execve(python, cmd + (["--exact"] if exact else []), env)  # the server is this process: Ctrl-C stops it
