"""``colbert-k8s local``: replay a rendered PyTorchJob or TrainJob here, as the launcher and kubelet would.

It is not a scheduler. It reads the manifest ``render`` produced (through ``podplan.py``) and, for the
fields it can honour, does what the Kubeflow Training Operator v1.9.4 or Trainer v2.3.0 and the
kubelet do:

* **env**: each replica gets the launcher's variables (PyTorchJob: ``MASTER_ADDR``/``PORT``,
  ``WORLD_SIZE``, ``RANK`` = pod index and ``PET_*``; TrainJob: ``PET_*`` only, the master named
  ``<job>-node-0-0.<job>`` on port 29500 under ``--isolate-network``) plus the container's own ``env``;
* **command, args, workingDir**: run as written, with mount paths mapped to local directories
  (the ConfigMap becomes a directory holding its files);
* **the workspace volume**: a PVC is shared by every pod, so it is ``--workdir`` itself. An
  ``emptyDir`` belongs to one pod: each replica gets ``--workdir/pods/<pod name>/``, which nothing
  else sees, survives restarts of the replica (as an emptyDir survives container restarts) and is
  emptied when a new ``local`` run starts (a new pod). The files the config names by relative path
  (training data, the BEIR split, a local model) are copied into each pod's workspace first, where
  the image or a data volume would have put them on a cluster; the summary says so;
* **SIGTERM**: sent to ``local`` (or to a replica) it reaches the replicas, which get the manifest's
  ``terminationGracePeriodSeconds`` to checkpoint before SIGKILL, as from the kubelet;
* **restarts**: ``restartPolicy: OnFailure`` with ``runPolicy.backoffLimit``. On a cluster the
  kubelet restarts the failed container and its peers then fail on the broken collective; here
  the replicas are restarted together, which is the same outcome without the wait for a timeout.

Whatever it cannot honour (GPUs that are not here, node selectors, the image...) is reported in one
line. ``--isolate-network`` runs each replica in its own network namespace (see ``netns.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from operator_cli import constants as C
from operator_cli.podplan import PodPlan, plan_pods
from operator_cli.spec import parse_training_config

__all__ = ["Replica", "plan_replicas", "run_local"]

_DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


@dataclass
class Replica:
    """One pod of the job, as a local process group."""

    replica: str  # master-0, worker-0, ...
    host: str  # the pod's DNS name on a cluster: <job>-master-0
    index: int  # RANK = PET_NODE_RANK
    command: list[str]
    env: dict[str, str]
    cwd: Path
    proc: subprocess.Popen | None = field(default=None, repr=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unsupported(plan: PodPlan, gpus_here: int) -> list[str]:
    """Fields of the manifest this machine cannot honour, one phrase each."""
    notes = []
    pod, container = plan.pod_spec, plan.container
    gpus = int(container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
    if gpus > gpus_here:
        notes.append(f"{gpus} GPU(s) per node requested, {gpus_here} here (processes use what is visible)")
    for key, what in (
        ("nodeSelector", "node selector"),
        ("tolerations", "tolerations"),
        ("priorityClassName", "priority class"),
        ("serviceAccountName", "service account"),
        ("imagePullSecrets", "image pull secrets"),
    ):
        if pod.get(key):
            notes.append(f"{what} ignored")
    if container.get("resources", {}).get("limits", {}).keys() - {"nvidia.com/gpu"}:
        notes.append("cpu/memory limits not enforced")
    notes.append(f"image {container['image']} not used (runs this checkout's code)")
    if plan.v2:
        notes.append(f"the runtime's JobSet failure policy is not read (restarts: up to {plan.backoff_limit})")
    return notes


def shares_workspace(plan: PodPlan) -> bool:
    """True when /workspace is a PersistentVolumeClaim (one volume for all pods), False for an emptyDir."""
    workspace = next((v for v in plan.pod_spec.get("volumes", []) if v["name"] == "workspace"), {})
    return "persistentVolumeClaim" in workspace


def pod_workspace(workdir: Path, host: str) -> Path:
    """Where an emptyDir-backed pod's /workspace lives here."""
    return workdir / "pods" / host


def plan_replicas(
    objects: list[dict[str, Any]],
    workdir: Path,
    config_dir: Path,
    master_addr: str,
    master_port: int,
) -> list[Replica]:
    """The processes the launcher would start, with their environment, command and working dir."""
    plan = plan_pods(objects)
    shared = shares_workspace(plan)

    def local_path(value: str, workspace: Path) -> str:
        for mount, local in {C.CONFIG_MOUNT: config_dir, C.WORKSPACE_MOUNT: workspace}.items():
            if value == mount or value.startswith(mount + "/"):
                return str(local) + value[len(mount) :]
        return value

    base = {k: v for k, v in os.environ.items() if k not in _DIST_VARS and not k.startswith("PET_")}
    base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"
    base["TQDM_MININTERVAL"] = "5"  # progress lines every 5 s, not a carriage-return storm
    container = plan.container
    replicas = []
    for index, (host, replica) in enumerate(zip(plan.hosts, plan.replica_names)):
        workspace = workdir if shared else pod_workspace(workdir, host)
        env = {**base, **plan.launcher_env(index, master_addr, master_port)}
        for var in container.get("env", []):
            if "value" in var:
                env[var["name"]] = local_path(var["value"], workspace)
            elif var["name"] not in os.environ and index == 0:  # a secretKeyRef: from this shell if set there
                click.echo(
                    f"local: {var['name']} comes from a Secret on the cluster; export it here to use it", err=True
                )
        command = [local_path(a, workspace) for a in container.get("command", []) + container.get("args", [])]
        cwd = Path(local_path(container.get("workingDir", C.WORKSPACE_MOUNT), workspace))
        replicas.append(Replica(replica, host, index, command, env, cwd))
    return replicas


def _pump(replica: Replica, lock: threading.Lock) -> None:
    """Copy a replica's output, line by line (a \\r ends a progress line), prefixed by its replica."""
    buf = b""
    stream = replica.proc.stdout
    prefix = f"[{replica.replica}] "  # the trainer's own lines add "[rank N]"
    while chunk := stream.read1(4096) if hasattr(stream, "read1") else stream.read(4096):
        buf += chunk.replace(b"\r", b"\n")
        *lines, buf = buf.split(b"\n")
        with lock:
            for line in lines:
                if line.strip():
                    click.echo(prefix + line.decode("utf-8", "replace"))
    if buf.strip():
        click.echo(prefix + buf.decode("utf-8", "replace"))


def _start(replicas: list[Replica], wrap) -> list[threading.Thread]:
    lock = threading.Lock()
    threads = []
    for r in replicas:
        r.cwd.mkdir(parents=True, exist_ok=True)
        r.proc = subprocess.Popen(
            wrap(r),
            cwd=r.cwd,
            env=r.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        t = threading.Thread(target=_pump, args=(r, lock), daemon=True)
        t.start()
        threads.append(t)
    return threads


def _stop(replicas: list[Replica], grace: float = 10.0) -> None:
    """SIGTERM each replica's whole process group (torchrun and its children), then SIGKILL."""
    for r in replicas:
        if r.proc and r.proc.poll() is None:
            try:
                os.killpg(r.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.time() + grace
    for r in replicas:
        if r.proc:
            try:
                r.proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(r.proc.pid, signal.SIGKILL)
                r.proc.wait()


def _summary(config_text: str, workdir: Path, name: str, restarts: int, seconds: float) -> None:
    out = workdir / parse_training_config(config_text).output_dir
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
        before = f"{m['before']['ndcg@10']:.4f} -> " if "before" in m else ""
        click.echo(
            f"nDCG@10 {before}{m['after']['ndcg@10']:.4f}   MRR@10 {m['after']['mrr@10']:.4f}   "
            f"Recall@100 {m['after']['recall@100']:.4f}   MAP@100 {m['after'].get('map@100', 0):.4f}  (exact MaxSim)"
        )
    if "index" in m:
        ix = m["index"]
        click.echo(
            f"nDCG@10 {ix['ndcg@10']:.4f}   MRR@10 {ix['mrr@10']:.4f}   Recall@100 {ix['recall@100']:.4f}   "
            f"MAP@100 {ix['map@100']:.4f}  (PLAID index: {ix['documents']} documents, built in "
            f"{ix['build_seconds']:.1f}s, {ix['size_mb']:.1f} MiB)"
        )
    click.echo(f"model: {m.get('model_dir')}")


def _gpus_here() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    res = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(1 for line in res.stdout.splitlines() if line.startswith("GPU "))


def run_local(objects: list[dict[str, Any]], workdir: Path, isolate_network: bool = False) -> int:
    """Run the job; returns the job's exit status (0 succeeded, 1 failed)."""
    plan = plan_pods(objects)
    name = plan.name
    cm = next(o for o in objects if o["kind"] == "ConfigMap")
    backoff, restart_policy = plan.backoff_limit, plan.restart_policy
    click.echo(f"local: not honoured here: {'; '.join(unsupported(plan, _gpus_here()))}", err=True)

    workdir = workdir.resolve()
    grace = float(plan.pod_spec.get("terminationGracePeriodSeconds", 30))
    master_ws = _announce_storage(plan, cm["data"][C.CONFIG_FILE], workdir)
    config_dir = Path(tempfile.mkdtemp(prefix=f"{name}-config-"))
    for fname, text in cm["data"].items():
        (config_dir / fname).write_text(text)
    network = None
    if isolate_network:
        from operator_cli.netns import Network

        network = Network.create(plan.hosts, domain=name if plan.v2 else None)
        click.echo(
            "local: replicas isolated in network namespaces: "
            + ", ".join(f"{h}={a}" for h, a in network.hosts.items()),
            err=True,
        )
    started = time.time()
    restarts = 0
    replicas: list[Replica] = []
    previous_term = signal.signal(signal.SIGTERM, _terminated)
    try:
        while True:
            master, port = plan.master(network is not None, _free_port())  # the launcher's name, per namespace
            replicas = plan_replicas(objects, workdir, config_dir, master, port)
            if network:
                for r in replicas:  # bind gloo/NCCL to the veth, as to a pod's eth0
                    r.env.update(GLOO_SOCKET_IFNAME="eth0", NCCL_SOCKET_IFNAME="eth0")
            wrap = (lambda r: network.wrap(r.host, r.command)) if network else (lambda r: r.command)
            threads = _start(replicas, wrap)
            failed = _wait_any_failure(replicas)
            if failed is None:
                for t in threads:
                    t.join(timeout=5)
                _summary(cm["data"][C.CONFIG_FILE], master_ws, name, restarts, time.time() - started)
                return 0
            _stop(replicas, grace)
            for t in threads:
                t.join(timeout=5)
            code = failed.proc.returncode
            why = f"signal {-code}" if code < 0 else f"exit code {code}"
            if restart_policy == "Never" or restarts >= backoff:
                click.echo(
                    f"error: job {name} failed: replica {failed.replica} ended with {why} and "
                    f"backoffLimit {backoff} is used up ({restarts} restart(s)); see its log lines above",
                    err=True,
                )
                return 1
            restarts += 1
            click.echo(
                f"local: replica {failed.replica} ended with {why}; restarting the job's replicas "
                f"({restarts}/{backoff}); the trainer resumes from its newest checkpoint",
                err=True,
            )
    except _Terminated:
        click.echo(
            f"local: SIGTERM: passed to the replicas, which checkpoint within {grace:.0f}s "
            "(terminationGracePeriodSeconds); run the same command again to resume",
            err=True,
        )
        _stop(replicas, grace)
        return 128 + signal.SIGTERM
    finally:  # Ctrl-C or any error: no replica outlives the command, no namespace or temp dir is left
        signal.signal(signal.SIGTERM, previous_term)
        _stop(replicas, grace)
        shutil.rmtree(config_dir, ignore_errors=True)
        if network:
            network.destroy()


class _Terminated(Exception):
    pass


def _terminated(_signum, _frame) -> None:
    raise _Terminated


def _announce_storage(plan: PodPlan, config_text: str, workdir: Path) -> Path:
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


def _wait_any_failure(replicas: list[Replica]) -> Replica | None:
    """Block until every replica succeeded (None) or one failed (that replica)."""
    while True:
        codes = [r.proc.poll() for r in replicas]
        for r, code in zip(replicas, codes):
            if code is not None and code != 0:
                return r
        if all(code == 0 for code in codes):
            return None
        time.sleep(0.2)


_POD_MARK = ".colbert-k8s-pod"


def prepare_pod_workspaces(plan: PodPlan, config_text: str, workdir: Path) -> list[str]:
    """Fresh per-pod workspaces (emptyDirs) holding the inputs the config names; returns what was copied.

    Only directories this command made (they hold a marker file) are ever emptied."""
    inputs = _relative_inputs(config_text, workdir)
    for host in plan.hosts:
        ws = pod_workspace(workdir, host)
        if ws.exists():
            if not (ws / _POD_MARK).is_file():
                raise click.ClickException(
                    f"{ws} exists and was not made by `colbert-k8s local`; move it away or pick another --workdir"
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
