"""``upload``: local data onto a job's claim (or any claim), so the config's relative paths find it in the pods
(:mod:`operator_cli.kube.upload`)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from operator_cli import constants as C
from operator_cli.commands.base import Command, cluster_of, cluster_options, job_name, namespace_option
from operator_cli.durations import DURATION
from operator_cli.errors import CliError
from operator_cli.kube import upload as U

__all__ = ["upload_cmd"]


@click.command("upload", cls=Command)
@click.argument("args", nargs=-1, metavar="[NAME] LOCAL_PATH [DEST]")
@click.option("--pvc", help="Upload onto this existing claim instead of job NAME's.")
@namespace_option
@cluster_options
@click.option("--overwrite", is_flag=True, help="Replace an existing DEST on the claim, once the new copy is whole.")
@click.option(
    "--image",
    default=C.DEFAULT_IMAGE,
    show_default=True,
    help="With --pvc: the upload pod's image (it needs python); for NAME, the job's image is used.",
)
@click.option("--image-pull-secret", "pull_secrets", multiple=True, help="With --pvc: a Secret for pulling --image.")
@click.option(
    "--active-deadline",
    type=DURATION,
    default="1h",
    show_default=True,
    help="The upload pod's lifetime (activeDeadlineSeconds), e.g. 30m or 2h; raise it for large data.",
)
def upload_cmd(
    args: tuple[str, ...],
    pvc: str | None,
    overwrite: bool,
    image: str,
    pull_secrets: tuple[str, ...],
    active_deadline: int,
    **o,
) -> None:
    """Copy LOCAL_PATH (a file or directory) onto job NAME's claim, at DEST under /workspace.

    DEST defaults to LOCAL_PATH when that is relative (data/train.jsonl lands where the config's data/train.jsonl
    is read), else to its last component. A short-lived pod of this tool's own mounts the claim and a tar is
    streamed into it over exec. Upload before the job reads: `submit --pvc-size 200Gi --suspend`, upload, then
    `resume NAME`."""
    want = 2 if pvc else 3
    if not want - 1 <= len(args) <= want:
        usage = "--pvc CLAIM LOCAL_PATH [DEST]" if pvc else "NAME LOCAL_PATH [DEST] (or --pvc CLAIM LOCAL_PATH [DEST])"
        raise CliError(f"upload takes {usage}, got {len(args)} argument(s)", hint="see `colbert-k8s upload --help`")
    name = None if pvc else job_name(args[0])
    local, dest = args[0 if pvc else 1], (args[2 if not pvc else 1] if len(args) == want else None)
    if not Path(local).exists():
        raise CliError(f"LOCAL_PATH {local} does not exist", hint="give a file or a directory on this machine")
    dest = dest or U.default_dest(local)
    U.claim_path(dest)  # before any request
    cluster = cluster_of(o)
    if pvc:
        pod = U.pod_for_claim(cluster, pvc, image, active_deadline, list(pull_secrets))
    else:
        pod = U.pod_for_job(cluster.get_own_job(name), cluster.ns, active_deadline)

    def bar(total: int):
        return click.progressbar(length=total, label=f"uploading {local}", file=sys.stderr)

    sent = U.upload(
        cluster, pod, Path(local), dest, overwrite=overwrite, progress=bar, warn=lambda line: click.echo(line, err=True)
    )
    click.echo(f"uploaded {local} to claim {pod.claim} at {U.claim_path(dest)} ({sent / 1e6:.1f} MB)")
