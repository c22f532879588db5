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

from tests.conftest import ROOT


def pod_env(rank: int, world: int, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_") and k not in ("RANK", "WORLD_SIZE")}
    env.update(
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
        RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        PET_NNODES=str(world),
        PET_NPROC_PER_NODE="1",
        PET_NODE_RANK=str(rank),
        PET_MASTER_ADDR="127.0.0.1",
        PET_MASTER_PORT=str(port),
    )
    return env


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
