"""``colbert-k8s``: render, submit, follow and delete ColBERT training jobs on Kubernetes.

    colbert-k8s doctor             (is this cluster ready for a first job?)
    colbert-k8s submit --nodes 2 --gpus-per-node 8 --image REG/colbert-train:TAG --config train.yaml
    colbert-k8s status NAME -w     colbert-k8s logs NAME -f --all
    colbert-k8s list -o json       colbert-k8s delete NAME
    colbert-k8s resize NAME --nodes 4
    colbert-k8s suspend NAME       colbert-k8s resume NAME
    colbert-k8s runtime render     colbert-k8s runtime install   (a TrainJob runtime that fails fast)
    colbert-k8s render ...         colbert-k8s local ...   (the same job, on this machine)

Options become a validated JobSpec, the JobSpec becomes objects (``render``), and ``submit``
sends exactly those objects. Importing this module never imports torch.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from operator_cli import constants as C
from operator_cli import ops, rules, show
from operator_cli.errors import CliError
from operator_cli.render import render, to_yaml
from operator_cli.spec import (
    JobSpec,
    check_shape,
    generate_name,
    parse_elastic,
    parse_pairs,
    parse_secret_envs,
    parse_toleration,
    read_config,
)

__all__ = ["main", "cli", "job_options", "build_spec", "cluster_options"]


class _Command(click.Command):
    """Refuses a single-valued option given twice (click would silently keep the last one)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        single = {
            name: opt
            for opt in self.params
            if isinstance(opt, click.Option) and not opt.multiple and not opt.count
            for name in opt.opts
        }
        seen: dict[str, str] = {}
        for arg in args:
            if arg == "--":
                break
            flag = arg.split("=", 1)[0]
            if flag in single:
                key = single[flag].name
                if key in seen:
                    also = "" if seen[key] == flag else f" (also as {seen[key]})"
                    raise CliError(f"{flag} is given twice{also}; keep one")
                seen[key] = flag
        return super().parse_args(ctx, args)


class _Usage(click.UsageError):
    """Click's own usage errors (an unknown flag, a value out of range) in the same two lines as ours,
    instead of its usage banner and a blank line."""

    def show(self, file=None) -> None:
        command = self.ctx.command_path if self.ctx else "colbert-k8s"
        click.echo(f"error: {self.format_message()}", err=True)
        click.echo(f"hint: see `{command} --help`", err=True)


class _Group(click.Group):
    """Shows a CliError as one line (plus a hint) and its exit code, never a traceback."""

    command_class = _Command

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.exceptions.NoArgsIsHelpError:  # a bare `colbert-k8s` shows the help, as click does
            raise
        except click.UsageError as e:  # `colbert-k8s --bogus`, `colbert-k8s sumbit`
            raise _Usage(e.format_message(), e.ctx) from None

    def invoke(self, ctx: click.Context):
        from operator_cli.kube import redact

        try:
            return super().invoke(ctx)
        except CliError as e:
            click.echo(f"error: {redact(e.message)}", err=True)
            if e.hint:
                click.echo(f"hint: {redact(e.hint)}", err=True)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)
        except click.UsageError as e:  # a subcommand's flags: unknown, missing, out of range
            raise _Usage(e.format_message(), e.ctx) from None
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as e:  # a bug of ours: still one line, and the details on request
            if os.environ.get("COLBERT_K8S_DEBUG"):
                raise
            first = redact(str(e).splitlines()[0] if str(e) else "")[:200]
            click.echo(f"error: internal error ({type(e).__name__}: {first})", err=True)
            click.echo("hint: rerun with COLBERT_K8S_DEBUG=1 for the traceback, and report it", err=True)
            ctx.exit(70)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="colbert-k8s")
def cli() -> None:
    """Train ColBERT retrievers with PyLate on Kubernetes (Kubeflow PyTorchJob)."""


D = JobSpec.defaults()  # the options' defaults are JobSpec's: one place states them


def job_options(fn):
    """The options shared by render, submit and local: everything that shapes the job."""
    options = [
        click.option(
            "--config",
            "config",
            required=True,
            type=click.Path(dir_okay=False),
            help="Training YAML (validated before anything is sent).",
        ),
        click.option("--name", help="Job name (DNS-1035). Default: colbert-<random>."),
        click.option("-n", "--namespace", help="Default: the kubeconfig context's namespace, else 'default'."),
        click.option(
            "--nodes",
            type=int,
            help=f"Pods: 1 Master + (nodes-1) Workers. Default: {D['nodes']}, or MAX with --elastic.",
        ),
        click.option(
            "--elastic",
            metavar="MIN:MAX",
            help="Elastic PyTorchJob: train on any MIN..MAX nodes; a lost node's survivors go on from the "
            "newest checkpoint (needs a PVC and training.global_batch_size).",
        ),
        click.option(
            "--gpus-per-node",
            default=D["gpus_per_node"],
            show_default=True,
            type=int,
            help="GPUs and processes per pod; 0 = CPU job, 1 process per pod.",
        ),
        click.option("--image", default=D["image"], show_default=True),
        click.option("--cpu", help="CPU request and limit per pod, e.g. 8."),
        click.option("--memory", help="Memory request and limit per pod, e.g. 64Gi."),
        click.option(
            "--shm-size", default=D["shm_size"], show_default=True, help="Memory-backed /dev/shm size; 0 disables it."
        ),
        click.option("--pvc", help="Existing PersistentVolumeClaim mounted at /workspace (data, checkpoints, model)."),
        click.option("--pvc-size", help="Create a PVC of this size for /workspace instead."),
        click.option("--storage-class", help="StorageClass of the PVC created by --pvc-size."),
        click.option(
            "--pod-local-storage",
            is_flag=True,
            help="With --nodes > 1 and no PVC: each pod keeps its own emptyDir /workspace; "
            "a deleted master pod then restarts the job from step 0.",
        ),
        click.option(
            "--termination-grace-period",
            default=D["termination_grace"],
            show_default=True,
            type=int,
            help="Seconds from SIGTERM (eviction, preemption) to SIGKILL; the trainer checkpoints in them.",
        ),
        click.option("--node-selector", multiple=True, metavar="K=V"),
        click.option("--toleration", multiple=True, metavar="KEY[=VALUE]:EFFECT"),
        click.option("--priority-class"),
        click.option("--queue", help="Kueue LocalQueue (label kueue.x-k8s.io/queue-name)."),
        click.option("--service-account"),
        click.option("--image-pull-secret", multiple=True),
        click.option("--env", multiple=True, metavar="K=V", help="Plain environment variable (never a credential)."),
        click.option(
            "--secret-env", multiple=True, metavar="VAR=SECRET/KEY", help="Variable from a Secret key (secretKeyRef)."
        ),
        click.option(
            "--backoff-limit",
            default=D["backoff_limit"],
            show_default=True,
            type=int,
            help="Restarts before the job fails.",
        ),
        click.option(
            "--active-deadline",
            default=D["active_deadline"],
            show_default=True,
            type=int,
            help="Seconds before a running job is stopped; 0 = never.",
        ),
        click.option(
            "--ttl-after-finished",
            default=D["ttl_after_finished"],
            show_default=True,
            type=int,
            help="Seconds a finished job is kept.",
        ),
        click.option("--nccl", type=click.Choice(["socket", "ib"]), help="NCCL network preset (GPU jobs)."),
        click.option(
            "--api",
            type=click.Choice(["pytorchjob", "trainjob", "auto"]),
            default=D["api"],
            show_default=True,
            help="PyTorchJob (Training Operator v1) or TrainJob (Kubeflow Trainer v2); "
            "auto (submit only): what the cluster serves, v2 if both.",
        ),
        click.option(
            "--runtime",
            help=f"The ClusterTrainingRuntime a TrainJob uses (--api trainjob). Default: {C.V2_SHIPPED_RUNTIME} "
            f"(`colbert-k8s runtime install`); submit falls back to the stock {C.V2_STOCK_RUNTIME} without it.",
        ),
        click.option("--label", multiple=True, metavar="K=V"),
        click.option("--annotation", multiple=True, metavar="K=V"),
        # scheduling on shared clusters (operator_cli/scheduling.py)
        click.option(
            "--topology-required",
            metavar="LEVEL",
            help="Kueue topology-aware scheduling: all pods in one domain of this node label "
            "(e.g. cloud.google.com/gce-topology-block), or wait.",
        ),
        click.option(
            "--topology-preferred", metavar="LEVEL", help="Kueue: pack the pods into as few domains of LEVEL as it can."
        ),
        click.option(
            "--mig",
            metavar="PROFILE",
            help="One MIG slice per pod (e.g. 1g.10gb): nvidia.com/mig-PROFILE instead of nvidia.com/gpu.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def build_spec(o: dict) -> JobSpec:
    """Options -> JobSpec: the only place flags are interpreted."""
    if o["api"] == "auto":
        raise CliError("--api auto asks the cluster which API it serves: use it with submit, or pick one")
    secret_env = parse_secret_envs(o["secret_env"])
    elastic = parse_elastic(o["elastic"]) if o["elastic"] is not None else None
    nodes = o["nodes"] if o["nodes"] is not None else elastic[1] if elastic else D["nodes"]
    return JobSpec(
        name=generate_name() if o["name"] is None else o["name"],
        config_text=read_config(o["config"]),
        namespace=_default_namespace(o) if o["namespace"] is None else o["namespace"],  # -n "" is refused
        nodes=nodes,
        gpus_per_node=o["gpus_per_node"],
        image=o["image"],
        cpu=o["cpu"],
        memory=o["memory"],
        shm_size=None if o["shm_size"] in ("0", "") else o["shm_size"],
        pvc=o["pvc"],
        pvc_size=o["pvc_size"],
        pod_local_storage=o["pod_local_storage"],
        termination_grace=o["termination_grace_period"],
        storage_class=o["storage_class"],
        node_selector=parse_pairs(o["node_selector"], "--node-selector"),
        tolerations=[parse_toleration(t) for t in o["toleration"]],
        priority_class=o["priority_class"],
        queue=o["queue"],
        service_account=o["service_account"],
        image_pull_secrets=list(o["image_pull_secret"]),
        env=parse_pairs(o["env"], "--env"),
        secret_env=secret_env,
        backoff_limit=o["backoff_limit"],
        active_deadline=o["active_deadline"] or None,
        ttl_after_finished=o["ttl_after_finished"],
        nccl=o["nccl"],
        api=o["api"],
        runtime=o["runtime"] or D["runtime"],
        labels=parse_pairs(o["label"], "--label"),
        annotations=parse_pairs(o["annotation"], "--annotation"),
        elastic=elastic,
        topology_required=o["topology_required"],
        topology_preferred=o["topology_preferred"],
        mig=o["mig"],
    )


def _scale_line(spec: JobSpec) -> str:
    """The nodes, then the trainer's own scale line (``trainer.scale.Scale``), word for word."""
    from trainer.scale import job_scale

    unit = "GPU" if spec.gpus_per_node else "CPU process"
    layout = f"{spec.nodes} node(s) x {spec.nproc_per_node} {unit}(s)"
    if spec.elastic:
        layout += f", elastic {spec.elastic[0]}..{spec.elastic[1]} node(s)"
    return f"{layout}; {job_scale(spec.train_config, spec.world_size).line()}"


def _default_namespace(o: dict) -> str:
    from operator_cli.kube import default_namespace

    return default_namespace(o.get("kubeconfig"), o.get("context"))


def cluster_options(fn):
    fn = click.option(
        "--request-timeout",
        default=C.REQUEST_TIMEOUT,
        show_default=True,
        type=click.FloatRange(min=1, max=600),
        help="Seconds to wait for each API request (a stalled server ends the command with one line).",
    )(fn)
    fn = click.option("--context", help="kubeconfig context to use.")(fn)
    fn = click.option(
        "--kubeconfig", type=click.Path(dir_okay=False), help="Default: $KUBECONFIG, ~/.kube/config, in-cluster."
    )(fn)
    return fn


def _cluster(o: dict):
    from operator_cli.kube import Cluster, connect

    namespace = _default_namespace(o) if o.get("namespace") is None else o["namespace"]  # -n "" is refused
    if not rules.full("dns1123_label", namespace):
        from operator_cli.spec import shown

        raise CliError(f"--namespace must be a DNS-1123 label, got {shown(namespace)}")
    return Cluster(
        connect(o.get("kubeconfig"), o.get("context"), o.get("request_timeout", C.REQUEST_TIMEOUT)), namespace
    )


@cli.command("render")
@job_options
@click.option(
    "-o", "--output-dir", type=click.Path(file_okay=False), help="Write one file per object here instead of stdout."
)
def render_cmd(output_dir: str | None, **o) -> None:
    """Print the manifests the job consists of (the same bytes as `submit --dry-run`)."""
    spec = build_spec(o)
    objects = render(spec)
    click.echo(f"scale: {_scale_line(spec)}", err=True)
    if not output_dir:
        click.echo(to_yaml(objects), nl=False)
        return
    out = Path(output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for obj in objects:
            path = out / f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(to_yaml([obj]))
            tmp.replace(path)
            click.echo(f"wrote {path}", err=True)
    except OSError as e:
        raise CliError(
            f"-o {output_dir}: cannot write there ({e.strerror or type(e).__name__})",
            hint="pass a directory you can write to",
        ) from None


@cli.command("submit")
@job_options
@cluster_options
@click.option("--dry-run", is_flag=True, help="Print exactly the objects that would be created, and stop.")
@click.option("--wait", is_flag=True, help="Follow the job until it succeeds (exit 0) or fails (exit 1).")
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    help="With --wait: give up after this many seconds (exit 1; the job keeps running).",
)
@click.option("--poll-interval", default=10.0, show_default=True, type=float, hidden=True)
def submit_cmd(dry_run: bool, wait: bool, timeout: float | None, poll_interval: float, **o) -> None:
    """Validate, check the cluster, create the job, and print what to run next."""
    if timeout is not None and not wait:
        raise CliError("--timeout applies to --wait; add --wait or drop --timeout")
    cluster = None
    if o["api"] == "auto":  # the one case where even --dry-run asks the cluster (read-only)
        cluster = _cluster(o)
        o["api"] = cluster.detect_api()
        click.echo(f"api: auto -> {o['api']} (what this cluster serves; Trainer v2 preferred)", err=True)
    spec = build_spec(o)
    objects = render(spec)
    if dry_run:
        if spec.api == "trainjob" and o["runtime"] is None:
            click.echo(f"runtime: {spec.runtime} (submit uses the stock {C.V2_STOCK_RUNTIME} where the cluster "
                       "lacks it)", err=True)  # fmt: skip
        click.echo(to_yaml(objects), nl=False)
        return
    cluster = cluster or _cluster(o)
    if spec.api == "trainjob" and o["runtime"] is None:
        spec, objects = _runtime_or_stock(cluster, spec, objects)
    secrets = sorted({ref.secret for ref in spec.secret_env.values()} | set(spec.image_pull_secrets))
    cluster.preflight(spec.api, secrets, spec.pvc, spec.runtime)
    created = cluster.create_all(objects)
    for obj in created:
        click.echo(f"created {obj['kind']} {spec.namespace}/{obj['metadata']['name']}")
    click.echo(f"scale: {_scale_line(spec)}")
    ns = "" if spec.namespace == "default" else f" -n {spec.namespace}"
    click.echo(
        f"next:\n  colbert-k8s status {spec.name}{ns}\n  colbert-k8s logs {spec.name}{ns} -f --all\n"
        f"  colbert-k8s delete {spec.name}{ns}"
    )
    if wait:
        from operator_cli.follow import wait_for_job

        sys.exit(wait_for_job(cluster, spec.name, poll_interval, timeout, click.echo))


def _runtime_or_stock(cluster, spec: JobSpec, objects: list[dict]):
    """``--runtime`` not given: this tool's runtime when the cluster has it, else the stock one, with the one
    line saying what that costs."""
    import dataclasses

    if cluster.runtime_exists(spec.runtime):
        return spec, objects
    click.echo(
        f"warning: ClusterTrainingRuntime {spec.runtime} is not installed: using the stock {C.V2_STOCK_RUNTIME}, "
        "which retries a permanent error (a bad config or data row, exit 2) until its restarts run out instead "
        "of failing at once; `colbert-k8s runtime install` installs it",
        err=True,
    )
    spec = dataclasses.replace(spec, runtime=C.V2_STOCK_RUNTIME)
    return spec, render(spec)


def _namespace_option(fn):
    return click.option("-n", "--namespace", help="Default: the kubeconfig context's namespace, else 'default'.")(fn)


def _job_name(name: str) -> str:
    """A NAME argument, checked before any request: never empty, '.', or a path the API would misread."""
    from operator_cli.spec import shown

    if not rules.full("dns1035", name):
        raise CliError(
            f"NAME must be a job name (a DNS-1035 label: a-z, 0-9, '-', starting with a letter), got {shown(name)}",
            hint="see `colbert-k8s list`",
        )
    return name


def _output_option(fn):
    return click.option(
        "-o",
        "--output",
        type=click.Choice(["table", "json", "yaml"]),
        default="table",
        show_default=True,
        help="json/yaml: the same fields as the table, for scripts (as kubectl -o).",
    )(fn)


@cli.command("status")
@click.argument("name")
@_namespace_option
@cluster_options
@_output_option
@click.option("-w", "--watch", is_flag=True, help="Print the status again whenever it changes, until the job ends.")
@click.option("--poll-interval", default=5.0, type=float, hidden=True)
def status_cmd(name: str, output: str, watch: bool, poll_interval: float, **o) -> None:
    """Job conditions, each replica's phase and restarts, and why a pod is stuck or failing."""
    import time

    name = _job_name(name)
    cluster = _cluster(o)
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


@cli.command("logs")
@click.argument("name")
@_namespace_option
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
    name = _job_name(name)
    cluster = _cluster(o)
    job = cluster.get_own_job(name)
    want = None if all_pods else (rank or 0)
    if not follow:
        from operator_cli.kube import kind_of

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
        return
    from operator_cli.follow import follow_logs

    follow_logs(cluster, name, want, poll_interval, click.echo, query)


def _seconds(duration: str | None) -> int | None:
    """``1h30m`` -> 5400: the durations kubectl's --since takes (hours, minutes, seconds)."""
    import re

    if duration is None:
        return None
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", duration)
    if not duration or not match or not any(match.groups()):
        raise CliError("--since must be a duration like 30s, 5m or 1h30m", hint="units: h, m, s")
    h, m, sec = (int(g or 0) for g in match.groups())
    return max(1, h * 3600 + m * 60 + sec)


@cli.command("list")
@_namespace_option
@click.option("-A", "--all-namespaces", is_flag=True)
@cluster_options
@_output_option
def list_cmd(all_namespaces: bool, output: str, **o) -> None:
    """This tool's jobs (by label), as a table."""
    from operator_cli.kube import job_state, kind_of

    items, cluster = [], _cluster(o)
    for j in cluster.list_jobs(all_namespaces):
        kind = kind_of(j)
        nodes, gpus = kind.nodes_and_gpus(j)
        meta = j["metadata"]
        items.append({"namespace": meta.get("namespace", ""), "name": meta["name"], "kind": kind.kind,
                      "state": job_state(j), "nodes": nodes, "gpusPerNode": gpus,
                      "created": meta.get("creationTimestamp")})  # fmt: skip
    if output != "table":
        click.echo(show.formatted({"items": items}, output))
        return
    if not items:
        click.echo("no colbert-k8s jobs" + ("" if all_namespaces else f" in namespace {cluster.ns}"))
        return
    rows = [[i["namespace"], i["name"], i["kind"], i["state"], i["nodes"], i["gpusPerNode"], show.age(i["created"])]
            for i in items]  # fmt: skip
    click.echo(show.table(["NAMESPACE", "NAME", "KIND", "STATE", "NODES", "GPUS/NODE", "AGE"], rows))


@cli.command("doctor")
@_namespace_option
@cluster_options
@click.option(
    "--api",
    type=click.Choice(["pytorchjob", "trainjob", "auto"]),
    default="auto",
    show_default=True,
    help="The job API you will submit with; auto: whichever the cluster serves.",
)
@_output_option
def doctor_cmd(api: str, output: str, **o) -> None:
    """Check the cluster before a first submit: one line per check, OK/WARN/FAIL with a hint.

    Exit code: 0 when every line is OK, 1 with a WARN, 2 with a FAIL."""
    from operator_cli.doctor import LEVELS, run_checks

    checks = run_checks(_cluster(o), api)
    if output != "table":
        click.echo(show.formatted({"checks": [vars(c) for c in checks]}, output))
    else:
        click.echo(
            show.table(["CHECK", "RESULT", "DETAIL", "HINT"], [[c.name, c.level, c.detail, c.hint] for c in checks])
        )
    worst = max((LEVELS[c.level] for c in checks), default=0)
    if worst:
        raise SystemExit(worst)


@cli.command("resize")
@click.argument("name")
@_namespace_option
@cluster_options
@click.option("--nodes", type=int, required=True, help="The new number of nodes (pods).")
@click.option("--gpus-per-node", type=int, default=None, help="The new GPUs per node (default: unchanged).")
def resize_cmd(name: str, nodes: int, gpus_per_node: int | None, **o) -> None:
    """Run the job on another number of nodes: keep its storage and config, recreate it with the new shape.

    The trainer resumes from the newest checkpoint. Needs a PVC workspace, and training.global_batch_size
    in the config when the world size changes."""
    from operator_cli.resize import resize

    name = _job_name(name)
    check_shape(nodes, gpus_per_node)  # before any request, as every other flag
    job = resize(_cluster(o), name, nodes, gpus_per_node)
    click.echo(f"resized {job.get('kind', C.KIND)} {job['metadata'].get('namespace', '')}/{name} to {nodes} node(s); "
               f"it resumes from its newest checkpoint (colbert-k8s logs {name} -f)")  # fmt: skip


@cli.command("delete")
@click.argument("name")
@_namespace_option
@cluster_options
@click.option(
    "--keep-storage", is_flag=True, help="Keep the PVC created by --pvc-size (it holds checkpoints and the model)."
)
def delete_cmd(name: str, keep_storage: bool, **o) -> None:
    """Remove the job and everything this tool created for it."""
    name = _job_name(name)
    cluster = _cluster(o)
    for what in cluster.delete_job(name, keep_storage):
        click.echo(f"deleted {what}")
    for what in cluster.skipped:
        click.echo(f"kept {what}", err=True)


@cli.command("fetch")
@click.argument("name")
@_namespace_option
@cluster_options
@click.option("--to", type=click.Path(file_okay=False), help="Directory to copy into. Default: ./NAME.")
@click.option("--overwrite", is_flag=True, help="Replace an existing non-empty --to, once the new copy is whole.")
@click.option(
    "--timeout",
    default=3600,
    show_default=True,
    type=click.IntRange(min=60, max=7 * 24 * 3600),
    help="Seconds the fetch pod may live (its activeDeadlineSeconds); raise it for large outputs.",
)
def fetch_cmd(name: str, to: str | None, overwrite: bool, timeout: int, **o) -> None:
    """Copy a finished job's final-model, metrics.json, best-model and index off its claim.

    A short-lived pod of this tool's own mounts the claim read-only and streams a tar (as kubectl cp);
    it is deleted when the copy ends. For jobs whose /workspace is a PVC; see export: for object storage."""
    from operator_cli.kube.fetch import fetch

    name = _job_name(name)
    dest = Path(to) if to else Path(name)
    bar = lambda total: click.progressbar(length=total, label=f"fetching {name}", file=sys.stderr)  # noqa: E731
    done = fetch(_cluster(o), name, dest, overwrite=overwrite, deadline=timeout, progress=bar,
                 warn=lambda line: click.echo(line, err=True))  # fmt: skip
    click.echo(f"fetched {', '.join(done.items)} of {name} into {dest} ({done.bytes / 1e6:.1f} MB)")


@cli.command("local")
@job_options
@click.option(
    "--workdir",
    default=".",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Local stand-in for the /workspace volume (the PVC): relative paths in the config resolve here.",
)
@click.option("--isolate-network", is_flag=True, help="Each replica in its own network namespace (root, Linux).")
def local_cmd(workdir: str, isolate_network: bool, **o) -> None:
    """Run the rendered job on this machine: one process group per replica, operator env, restarts."""
    import importlib.util

    from operator_cli.local import run_local

    missing = [m for m in ("torch", "pylate") if importlib.util.find_spec(m) is None]
    if missing:
        raise CliError(
            f"`local` runs the trainer on this machine, but {', '.join(missing)} is not installed",
            hint="pip install -e '.[train]' (or run scripts/setup.sh train)",
        )
    spec = build_spec(o)
    click.echo(f"scale: {_scale_line(spec)}", err=True)
    objects = render(spec)
    if spec.api == "trainjob":  # its restarts are its runtime's: replay the runtime's failure policy
        from operator_cli.kube.runtime import known_runtime

        objects += [r for r in [known_runtime(spec.runtime, spec.image)] if r]
    sys.exit(run_local(objects, _writable_dir(Path(workdir)), isolate_network=isolate_network))


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


ops.register(cli, cluster_options, _namespace_option, _cluster, _job_name)  # runtime, suspend, resume


def main() -> None:
    cli(prog_name="colbert-k8s")


if __name__ == "__main__":
    main()
