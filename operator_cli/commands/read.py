"""The commands that read a cluster: ``status``, ``logs``, ``list``, ``doctor``, and ``fetch`` (which copies a
finished job's outputs off its claim). ``-o`` is a format for each that prints a record: table, json, yaml."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from operator_cli import show
from operator_cli.commands.base import Command, cluster_of, cluster_options, job_name, namespace_option, output_option
from operator_cli.doctor import LEVELS, run_checks
from operator_cli.durations import Duration, seconds
from operator_cli.errors import CliError
from operator_cli.follow import follow_logs
from operator_cli.kube.fetch import fetch
from operator_cli.kube.kinds import API_CHOICES, job_state, kind_of
from operator_cli.tune.cluster import list_row, list_sweeps

__all__ = ["doctor_cmd", "fetch_cmd", "list_cmd", "logs_cmd", "status_cmd"]


@click.command("status", cls=Command)
@click.argument("name")
@namespace_option
@cluster_options
@output_option
@click.option("-w", "--watch", is_flag=True, help="Print the status again whenever it changes, until the job ends.")
@click.option("--poll-interval", default=5.0, type=float, hidden=True)
def status_cmd(name: str, output: str, watch: bool, poll_interval: float, **o) -> None:
    """Job conditions, each replica's phase and restarts, and why a pod is stuck or failing."""
    name = job_name(name)
    cluster = cluster_of(o)
    shown_before = None
    while True:
        record = show.status_record(cluster, name)
        text = show.status_text(record, output)
        if text != shown_before:
            click.echo(text if shown_before is None else "\n" + text)
            shown_before = text
        if not watch or record["state"] in ("Succeeded", "Failed"):
            return
        time.sleep(poll_interval)


@click.command("logs", cls=Command)
@click.argument("name")
@namespace_option
@cluster_options
@click.option("-f", "--follow", is_flag=True, help="Stream new lines, across pod restarts, until the job ends.")
@click.option("--rank", type=click.IntRange(min=0), default=None, help="Only the pod of this node rank (0 = master).")
@click.option("--all", "all_pods", is_flag=True, help="Every replica (default: rank 0 only).")
@click.option("--tail", type=click.IntRange(min=0), help="Only the last N lines of each pod (as kubectl).")
@click.option("--since", help="Only lines newer than a duration like 30s, 5m or 1h30m (as kubectl).")
@click.option("-p", "--previous", is_flag=True, help="The previous container's log (before its last restart).")
@click.option("--timestamps", is_flag=True, help="Prefix each line with the kubelet's RFC3339 timestamp.")
@click.option("--poll-interval", default=5.0, type=float, hidden=True)
def logs_cmd(
    name: str,
    follow: bool,
    rank: int | None,
    all_pods: bool,
    tail: int | None,
    since: str | None,
    previous: bool,
    timestamps: bool,
    poll_interval: float,
    **o,
) -> None:
    """Log lines of the job's pods, each prefixed by its replica and rank."""
    if rank is not None and all_pods:
        raise CliError("--rank and --all exclude each other")
    if previous and follow:
        raise CliError("--previous and --follow exclude each other: a previous container has ended")
    query = {"tail_lines": tail, "since_seconds": _seconds(since), "previous": previous, "timestamps": timestamps}
    name = job_name(name)
    cluster = cluster_of(o)
    job = cluster.get_own_job(name)
    want = None if all_pods else (rank or 0)
    if follow:
        follow_logs(cluster, name, want, poll_interval, click.echo, query)
        return
    kind = kind_of(job)
    pods = [p for p in cluster.pods(job) if want is None or p.rank == want]
    if not pods:
        raise CliError(
            f"no pod{'' if want is None else f' of rank {want}'} for job {name} yet",
            hint=f"see `colbert-k8s status {name}`",
            exit_code=1,
        )
    for p in pods:
        for line in cluster.log_lines(p.name, kind, **query):
            click.echo(f"[{p.replica} rank {p.rank}] {line}")


def _seconds(duration: str | None) -> int | None:
    """``1h30m`` -> 5400: the durations kubectl's --since takes (:mod:`operator_cli.durations`).

    >>> _seconds("1h30m"), _seconds("45s"), _seconds(None)
    (5400, 45, None)
    """
    return None if duration is None else max(1, int(seconds(duration, "--since")))


@click.command("list", cls=Command)
@namespace_option
@click.option("-A", "--all-namespaces", is_flag=True, help="Jobs in every namespace, not only -n's (kubectl -A).")
@cluster_options
@output_option
def list_cmd(all_namespaces: bool, output: str, **o) -> None:
    """This tool's jobs and sweeps (by label), as a table."""
    items, cluster = [], cluster_of(o)
    for j in cluster.list_jobs(all_namespaces):
        kind = kind_of(j)
        nodes, gpus = kind.nodes_and_gpus(j)
        meta = j["metadata"]
        items.append(
            {
                "namespace": meta.get("namespace", ""),
                "name": meta["name"],
                "kind": kind.kind,
                "state": job_state(j),
                "nodes": nodes,
                "gpusPerNode": gpus,
                "created": meta.get("creationTimestamp"),
            }
        )
    items += [list_row(s) for s in list_sweeps(cluster, all_namespaces)]  # tune's sweeps, beside the jobs
    if output != "table":
        click.echo(show.formatted({"items": items}, output))
        return
    if not items:
        click.echo("no colbert-k8s jobs" + ("" if all_namespaces else f" in namespace {cluster.ns}"))
        return
    rows = [
        [i["namespace"], i["name"], i["kind"], i["state"], i["nodes"], i["gpusPerNode"], show.age(i["created"])]
        for i in items
    ]
    click.echo(show.table(["NAMESPACE", "NAME", "KIND", "STATE", "NODES", "GPUS/NODE", "AGE"], rows))


@click.command("doctor", cls=Command)
@namespace_option
@cluster_options
@click.option(
    "--api",
    type=click.Choice(API_CHOICES),
    default="auto",
    show_default=True,
    help="The job API you will submit with; auto: whichever the cluster serves.",
)
@output_option
def doctor_cmd(api: str, output: str, **o) -> None:
    """Check the cluster before a first submit: one line per check, OK/WARN/FAIL with a hint.

    Exit code: 0 when every line is OK, 1 with a WARN, 2 with a FAIL."""
    checks = run_checks(cluster_of(o), api)
    if output != "table":
        click.echo(show.formatted({"checks": [vars(c) for c in checks]}, output))
    else:
        click.echo(
            show.table(["CHECK", "RESULT", "DETAIL", "HINT"], [[c.name, c.level, c.detail, c.hint] for c in checks])
        )
    worst = max((LEVELS[c.level] for c in checks), default=0)
    if worst:
        raise SystemExit(worst)


@click.command("fetch", cls=Command)
@click.argument("name")
@namespace_option
@cluster_options
@click.option("--to", type=click.Path(file_okay=False), help="Directory to copy into. Default: ./NAME.")
@click.option("--overwrite", is_flag=True, help="Replace an existing non-empty --to, once the new copy is whole.")
@click.option(
    "--active-deadline",
    default="1h",
    show_default=True,
    type=Duration(low=60, high=7 * 24 * 3600),
    help="How long the fetch pod may live (its activeDeadlineSeconds), e.g. 30m or 4h; raise it for large outputs.",
)
@click.option("--timeout", "renamed", hidden=True, help="Renamed --active-deadline in 0.4.")
def fetch_cmd(name: str, to: str | None, overwrite: bool, active_deadline: int, renamed: str | None, **o) -> None:
    """Copy a finished job's final-model, metrics.json, best-model and index off its claim.

    A short-lived pod of this tool's own mounts the claim read-only and streams a tar (as kubectl cp);
    it is deleted when the copy ends. For jobs whose /workspace is a PVC; see export: for object storage."""
    if renamed is not None:  # one meaning per flag: --timeout is a wait (submit --wait), this is a lifetime
        raise CliError(
            "fetch --timeout is now --active-deadline (the fetch pod's lifetime)",
            hint="pass --active-deadline with the same value, e.g. --active-deadline 2h",
        )
    name = job_name(name)
    dest = Path(to) if to else Path(name)

    def bar(total: int):
        return click.progressbar(length=total, label=f"fetching {name}", file=sys.stderr)

    done = fetch(
        cluster_of(o),
        name,
        dest,
        overwrite=overwrite,
        deadline=active_deadline,
        progress=bar,
        warn=lambda line: click.echo(line, err=True),
    )
    click.echo(f"fetched {', '.join(done.items)} of {name} into {dest} ({done.bytes / 1e6:.1f} MB)")
