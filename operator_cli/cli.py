"""``colbert-k8s``: render, submit, follow and delete ColBERT training jobs on Kubernetes.

    colbert-k8s doctor             (is this cluster ready for a first job?)
    colbert-k8s submit --nodes 2 --gpus-per-node 8 --image REG/colbert-train:TAG --config train.yaml
    colbert-k8s status NAME -w     colbert-k8s logs NAME -f --all
    colbert-k8s list -o json       colbert-k8s delete NAME
    colbert-k8s upload NAME data/  (local data onto a job's claim; `submit --suspend` first)
    colbert-k8s fetch NAME         (a finished job's model, metrics and index, off its claim)
    colbert-k8s resize NAME --nodes 4
    colbert-k8s suspend NAME       colbert-k8s resume NAME
    colbert-k8s runtime render     colbert-k8s runtime install   (a TrainJob runtime that fails fast)
    colbert-k8s render ... [-d DIR]  colbert-k8s local ...   (the same job, on this machine)
    colbert-k8s tune ... --param KEY=SPACE [--local]   colbert-k8s tune status NAME   (a sweep of jobs)
    colbert-k8s serve --local URI    colbert-k8s serve apply NAME|URI   (search and rerank, here or on KServe)
    colbert-k8s register NAME|URI    (the export as a version in the Kubeflow Model Registry)
    colbert-k8s export-index URI --corpus DIR --to qdrant://HOST/COLL   (the corpus into a vector database)

Options become a validated JobSpec, the JobSpec becomes objects (``render``), and ``submit`` sends exactly
those objects. The commands live in :mod:`operator_cli.commands`, one module per area; this module is the
entry point (``colbert-k8s = operator_cli.cli:main``). Importing it never imports torch.
"""

from __future__ import annotations

import click

from operator_cli.commands import change, export_index, export_onnx, job, read, register, runtime, serve, tune, upload
from operator_cli.commands.base import Group, cluster_options
from operator_cli.commands.job import build_spec, job_options

__all__ = ["main", "cli", "job_options", "build_spec", "cluster_options"]


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="colbert-k8s")
def cli() -> None:
    """Train ColBERT retrievers with PyLate on Kubernetes (Kubeflow PyTorchJob or TrainJob)."""


for command in (
    job.render_cmd,
    job.submit_cmd,
    job.local_cmd,
    read.status_cmd,
    read.logs_cmd,
    read.list_cmd,
    read.doctor_cmd,
    read.fetch_cmd,
    upload.upload_cmd,
    change.resize_cmd,
    change.delete_cmd,
    change.suspend_cmd,
    change.resume_cmd,
    runtime.runtime_group,
    tune.tune_group,
    serve.serve_group,
    register.register_cmd,
    export_index.export_index_cmd,
    export_onnx.export_onnx_cmd,
):
    cli.add_command(command)


cli.sections = {
    "Run a job": ("render", "submit", "local"),
    "Follow it": ("status", "logs", "list"),
    "Change it": ("resize", "suspend", "resume", "delete"),
    "Data on its claim": ("upload", "fetch"),
    "Set up a cluster": ("doctor", "runtime"),
    "Sweeps and the model at work": ("tune", "serve", "register", "export-index", "export-onnx"),
}


def main() -> None:
    cli(prog_name="colbert-k8s")


if __name__ == "__main__":
    main()
