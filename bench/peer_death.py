"""How long the surviving replica takes to exit after its peer dies or freezes (2 CPU replicas).

    python bench/peer_death.py --record lab/benchmarks/results.jsonl

The replicas are planned by `colbert-k8s local`'s own code (operator variables, per-pod workspaces)
and started by hand, so that nothing but the trainer notices the death. Scenarios:

* ``kill-worker``: SIGKILL rank 1 (the process is gone; its TCP connections are reset);
* ``stop-worker``: SIGSTOP rank 1 (frozen, connections open: what a lost node or a partition looks
  like; without a watchdog the survivor waits for the process-group timeout, 30 minutes by default);
* ``kill-master``: SIGKILL rank 0 (the rendezvous store's host goes with it).

Reported: seconds from the signal to the survivor's exit, and its exit code and last log line.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

if __package__ in (None, ""):  # `python bench/X.py` as well as `python -m bench.X`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ENV, free_port, git_commit, minilm, output_arguments, quickstart_data, write_result

SCENARIOS = {"kill-worker": (1, signal.SIGKILL), "stop-worker": (1, signal.SIGSTOP), "kill-master": (0, signal.SIGKILL)}


def _replicas(tmp: Path, data: Path, peer_timeout: int):
    from operator_cli.local import plan_replicas
    from operator_cli.render import render
    from operator_cli.spec import JobSpec

    cfg = {
        "model": {"name_or_path": minilm(), "query_length": 16, "document_length": 48},
        "data": {"train": {"path": str(data)}},
        "training": {"per_device_batch_size": 4, "max_steps": 10_000, "log_every": 1},
        "checkpoint": {"every_steps": 10_000},
        "evaluation": {"after_training": False},
        "distributed": {"peer_timeout_seconds": peer_timeout},
    }
    text = yaml.safe_dump(cfg)
    spec = JobSpec(name="bench", config_text=text, nodes=2, gpus_per_node=0, pod_local_storage=True)
    (tmp / "config").mkdir(parents=True, exist_ok=True)
    (tmp / "config" / "train.yaml").write_text(text)
    return plan_replicas(render(spec), tmp / "ws", tmp / "config", "127.0.0.1", free_port())


def measure(tmp: Path, data: Path, victim: int, sig: signal.Signals, peer_timeout: int) -> dict:
    procs, logs = [], []
    for r in _replicas(tmp, data, peer_timeout):
        r.cwd.mkdir(parents=True, exist_ok=True)
        log = r.cwd / "log.txt"
        with open(log, "w") as f:
            procs.append(subprocess.Popen(r.command, cwd=r.cwd, env={**ENV, **r.env}, stdout=f, stderr=f))
        logs.append(log)
    deadline = time.time() + 300
    while not re.search(r"step 5/", logs[0].read_text()):
        if time.time() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError(f"no step 5:\n{logs[0].read_text()[-2000:]}")
        time.sleep(0.05)
    survivor = procs[1 - victim]
    sent = time.perf_counter()
    procs[victim].send_signal(sig)
    try:
        code = survivor.wait(timeout=peer_timeout * 3 + 60)
        seconds = round(time.perf_counter() - sent, 1)
    except subprocess.TimeoutExpired:
        survivor.kill()
        code, seconds = None, None
    for p in procs:
        p.kill()
        p.wait()
    lines = logs[1 - victim].read_text().replace("\r", "\n").splitlines()
    last = [line for line in lines if "error" in line.lower()][-1:]
    return {"seconds_to_exit": seconds, "exit_code": code, "last_line": last[0][:300] if last else ""}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peer-timeout", type=int, default=60, help="distributed.peer_timeout_seconds (the default)")
    output_arguments(p, "peer-death")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        data = quickstart_data(tmp / "data")
        results = {}
        for name, (victim, sig) in SCENARIOS.items():
            results[name] = measure(tmp / name, data, victim, sig, args.peer_timeout)
            print(f"{name}: {results[name]}", flush=True)
    out = {"commit": git_commit(), "peer_timeout_seconds": args.peer_timeout, "process_group_timeout_seconds": 1800}
    write_result({**out, "results": results}, args)


if __name__ == "__main__":
    main()
