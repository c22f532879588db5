"""Start trainer ranks the way the Training Operator starts pods: one process each, its own /workspace.

Each "pod" gets the operator's variables (RANK = pod index, WORLD_SIZE, MASTER_ADDR/PORT, PET_*) and
its own working directory, as an ``emptyDir`` would give it: nothing one rank writes is seen by
another. What this stand-in does not do: separate network namespaces (see ``--isolate-network``
in ``local``) and a kubelet's restart delays.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from operator_cli import constants as C
from operator_cli.kube.kinds import kind_named
from operator_cli.podplan import PodPlan
from tests.helpers import ROOT


def pod_env(rank: int, world: int, port: int) -> dict[str, str]:
    """The Training Operator's variables for pod ``rank`` of ``world`` one-process pods: the
    production :meth:`PodPlan.launcher_env`, on loopback."""
    plan = PodPlan(
        kind=kind_named(C.KIND),
        name="test",
        hosts=[f"test-pod-{i}" for i in range(world)],
        replica_names=[f"pod-{i}" for i in range(world)],
        pod_spec={},
        container={},
        restart_policy="OnFailure",
        backoff_limit=0,
        nproc="1",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_") and k not in ("RANK", "WORLD_SIZE")}
    return {**env, "PYTHONPATH": str(ROOT), **plan.launcher_env(rank, "127.0.0.1", port)}


def run_one_pod(
    config: Path, *launch: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """The trainer as a one-pod job runs it: no launcher variables (a single process needs none), the
    config's directory as the working directory. ``launch``: what follows ``python`` (default ``-m trainer``:
    a ``-c`` script wraps the trainer); ``env``: variables added to this environment."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "RANK", "WORLD_SIZE", "MASTER_"))}
    return subprocess.run(
        [sys.executable, *(launch or ("-m", "trainer")), "--config", str(config)],
        cwd=config.parent,
        env={**base, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_pods(config: Path, workspaces: list[Path], port: int) -> list[subprocess.Popen]:
    procs = []
    for rank, ws in enumerate(workspaces):
        ws.mkdir(parents=True, exist_ok=True)
        log = open(ws / f"log-{len(list(ws.glob('log-*')))}.txt", "w")  # noqa: SIM115 (closed with the process)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "trainer", "--config", str(config)],
                cwd=ws,
                env=pod_env(rank, len(workspaces), port),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    return procs


def wait_pods(procs: list[subprocess.Popen], timeout: float = 300) -> list[int]:
    return [p.wait(timeout=timeout) for p in procs]


def last_log(ws: Path) -> str:
    logs = sorted(ws.glob("log-*.txt"), key=lambda p: int(p.stem.split("-")[1]))
    return logs[-1].read_text() if logs else ""
