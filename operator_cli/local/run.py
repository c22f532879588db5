"""The kubelet's part: run the replicas, restart them together within ``backoffLimit``, pass SIGTERM on, sum up."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import click
from filelock import FileLock, Timeout

from operator_cli import constants as C
from operator_cli.errors import CliError
from operator_cli.kube.kinds import plan_pods
from operator_cli.local.elastic import replay_elastic
from operator_cli.local.processes import reap_network, start, start_reaper, stop, wait_any_failure
from operator_cli.local.replicas import POD_TAG, Replica, plan_replicas, unsupported
from operator_cli.local.workspaces import announce_storage, prepare_pod_workspaces
from operator_cli.netns import Network
from operator_cli.objects import KubeObject
from operator_cli.podplan import PodPlan
from operator_cli.spec import parse_training_config
from trainer.config.schema import METRICS

__all__ = ["LOCK_FILE", "free_port", "run_local"]

LOCK_FILE = ".colbert-k8s-local.lock"  # in --workdir (the quickstart's is the checkout: .gitignore names it)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now: a local job's rendezvous (the tests' and benches' too)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _summary(
    config_text: str, workdir: Path, name: str, restarts: int, seconds: float, pod_local: bool = False
) -> None:
    """The closing lines: steps, figures, and where the outputs are on this machine. ``pod_local``: ``workdir`` is
    the master pod's emptyDir stand-in (no ``--pvc``/``--pvc-size``), which says so before the paths."""
    cfg = parse_training_config(config_text)
    out = workdir / cfg.output_dir
    metrics_path = out / "metrics.json"
    if not metrics_path.is_file():
        click.echo(f"job {name} succeeded in {seconds:.0f}s with {restarts} restart(s); no metrics.json in {out}")
        return
    m = json.loads(metrics_path.read_text())
    line = f"job {name} succeeded: {m.get('steps')} steps, {seconds:.0f}s wall, {restarts} restart(s)"
    if m.get("final_loss") is not None:
        line += f", final loss {m['final_loss']:.4f}"
    click.echo(line)
    if "after" in m:
        before = m.get("before", {})
        click.echo(_metrics_line(m["after"], before) + "  (exact MaxSim)")
    if "index" in m:
        ix = m["index"]
        click.echo(
            _metrics_line(ix) + f"  (PLAID index: {ix['documents']} documents, built in "
            f"{ix['build_seconds']:.1f}s, {ix['size_mb']:.1f} MiB)"
        )
    if pod_local:
        click.echo(
            f"outputs in the master pod's /workspace, an emptyDir stand-in: {workdir} (emptied when this job runs "
            "again; --pvc-size keeps them in --workdir)"
        )
    for line in _outputs(m, out, workdir, exported=cfg.export is not None):
        click.echo(line)


def _outputs(m: dict, out: Path, workdir: Path, exported: bool) -> list[str]:
    """Where the job's outputs are: the model and the index on this machine (the trainer names them as the
    config does, relative to the job's volume: here the workdir), and the export's destination."""
    lines = [f"model: {workdir / m['model_dir']}"] if m.get("model_dir") else []
    if isinstance(m.get("index"), dict) and m["index"].get("path"):
        lines.append(f"index: {workdir / m['index']['path']}")
    if not exported:  # an export.json left by an earlier config's export is not this job's
        return lines
    try:
        sent = json.loads((out / "export.json").read_text())
        lines.append(f"export: {sent['destination']} ({sent['files']} files, {sent['bytes'] / 2**20:.1f} MiB)")
    except (OSError, ValueError, KeyError, TypeError):  # no export asked for (or an older trainer's)
        pass
    return lines


def _metrics_line(after: dict[str, float], before: dict[str, float] | None = None) -> str:
    """``nDCG@10 0.5790 -> 0.6990   MRR@10 ...``: every metric, with its value before training if known."""
    before = before or {}
    return "   ".join(
        f"{label} {f'{before[key]:.4f} -> ' if key in before else ''}{after[key]:.4f}"
        for key, label in METRICS.items()
        if key in after
    )


def _gpus_here() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    res = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(1 for line in res.stdout.splitlines() if line.startswith("GPU "))


def run_local(objects: list[KubeObject], workdir: Path, isolate_network: bool = False, verbose: bool = False) -> int:
    """Run the job; returns the job's exit status (0 succeeded, 1 failed). ``verbose``: every line the
    replicas print, every rank's (operator_cli/local/output.py says what is left out without it)."""
    plan = plan_pods(objects)
    click.echo(f"local: not honoured here: {'; '.join(unsupported(plan, _gpus_here()))}", err=True)
    workdir = workdir.resolve()
    with _claimed(workdir):  # before anything is written under it; released however the replay ends
        return _replay(plan, objects, workdir, isolate_network, verbose)


def _replay(plan: PodPlan, objects: list[KubeObject], workdir: Path, isolate_network: bool, verbose: bool) -> int:
    """Lay out the workspaces and the config, run the replicas (:func:`_restarts`, or torchrun's agents for an
    elastic job), and leave no process, namespace or temporary directory behind, however it ends."""
    name = plan.name
    config = next(o for o in objects if o["kind"] == "ConfigMap")["data"]
    grace = float(plan.pod_spec.get("terminationGracePeriodSeconds", 30))
    master_ws = announce_storage(plan, config[C.CONFIG_FILE], workdir)
    config_dir = Path(tempfile.mkdtemp(prefix=f"{name}-config-"))
    reaper = start_reaper(f"{POD_TAG}={os.getpid()}-".encode(), config_dir)  # if this process is killed
    for fname, text in config.items():
        (config_dir / fname).write_text(text)
    network = None
    started = time.time()
    live: list[Replica] = []  # the replicas running now, for the cleanup below
    previous_term = signal.signal(signal.SIGTERM, _terminated)
    try:
        if isolate_network:  # each namespace told to the reaper as it is made: gone even if this process is killed
            network = Network.create(plan.hosts, domain=plan.domain, made=lambda ns: reap_network(reaper, ns))
            click.echo(
                "local: replicas isolated in network namespaces: "
                + ", ".join(f"{h}={a}" for h, a in network.hosts.items()),
                err=True,
            )
        wrap = (lambda r: network.wrap(r.host, r.command)) if network else (lambda r: r.command)

        def new_replicas() -> list[Replica]:
            master, port = plan.master(network is not None, free_port())  # the launcher's name, per namespace
            live[:] = plan_replicas(objects, workdir, config_dir, master, port)
            if network:
                for r in live:  # bind gloo/NCCL to the veth, as to a pod's eth0
                    r.env.update(GLOO_SOCKET_IFNAME="eth0", NCCL_SOCKET_IFNAME="eth0")
            return live

        if plan.elastic:  # torchrun's agents restart and re-form the group; the kubelet's part is per pod
            code, restarts = replay_elastic(plan, new_replicas(), wrap, verbose)
        else:
            code, restarts = _restarts(
                plan, new_replicas, wrap, grace, workdir, config[C.CONFIG_FILE], master_ws, verbose
            )
        if code == 0:
            _summary(config[C.CONFIG_FILE], master_ws, name, restarts, time.time() - started, master_ws != workdir)
        return code
    except _Terminated:
        click.echo(
            f"local: SIGTERM: passed to the replicas, which checkpoint within {grace:.0f}s "
            "(terminationGracePeriodSeconds); run the same command again to resume",
            err=True,
        )
        stop(live, grace)
        return 128 + signal.SIGTERM
    finally:  # Ctrl-C or any error: no replica outlives the command, no namespace or temp dir is left
        signal.signal(signal.SIGTERM, previous_term)
        stop(live, grace)
        shutil.rmtree(config_dir, ignore_errors=True)
        reaper.stdin.close()  # it sweeps (nothing is left) and exits in its own time
        if network:
            network.destroy()


def _restarts(
    plan: PodPlan,
    new_replicas: Callable[[], list[Replica]],
    wrap: Callable,
    grace: float,
    workdir: Path,
    config_text: str,
    master_ws: Path,
    verbose: bool,
) -> tuple[int, int]:
    """The controller's part: all replicas again after a failure, within the job's restarts, unless the
    failure is permanent under its rule; returns (exit status, restarts)."""
    failure, restarts = plan.failure, 0
    while True:
        replicas = new_replicas()
        threads = start(replicas, wrap, verbose)
        failed = wait_any_failure(replicas)
        if failed is None:
            for t in threads:
                t.join(timeout=5)
            return 0, restarts
        stop(replicas, grace)
        for t in threads:
            t.join(timeout=5)
        code = failed.proc.returncode
        why = f"signal {-code}" if code < 0 else f"exit code {code}"
        permanent = failure.is_permanent(code)  # the controller's rule, read from the manifest (podplan)
        if permanent or restarts >= failure.restarts:
            verdict = (
                f"a permanent failure under {failure.rule} (fix the config or data; a restart cannot)"
                if permanent
                else f"{plan.restart_limit} {failure.restarts} is used up ({restarts} restart(s))"
            )
            click.echo(
                f"error: job {plan.name} failed: replica {failed.replica} ended with {why}, {verdict}; "
                "see its log lines above",
                err=True,
            )
            return 1, restarts
        restarts += 1
        click.echo(
            f"local: replica {failed.replica} ended with {why}; restarting the job's replicas "
            f"({restarts}/{failure.restarts}); the trainer resumes from its newest checkpoint",
            err=True,
        )
        if failure.recreates_pods and master_ws != workdir:  # new pods: their emptyDirs start empty
            prepare_pod_workspaces(plan, config_text, workdir)
            click.echo("local: the restart recreates the pods: their emptyDir workspaces start empty", err=True)


@contextlib.contextmanager
def _claimed(workdir: Path) -> Iterator[None]:
    """Hold --workdir for this replay: it stands for the job's volume, and two replays training into the same
    output_dir would interleave their checkpoints (as a second job of the same name is refused by the API
    server with 409). A lock file, released by the OS if this process dies."""
    workdir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(workdir / LOCK_FILE)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise CliError(
            f"--workdir {workdir} is in use by another `colbert-k8s local` replay",
            hint="wait for it to end (or stop it with Ctrl-C: it checkpoints), or pass another --workdir",
        ) from None
    try:
        yield
    finally:
        lock.release()


class _Terminated(Exception):
    pass


def _terminated(_signum, _frame) -> None:
    raise _Terminated
