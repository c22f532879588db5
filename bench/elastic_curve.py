"""An elastic resume, seen as loss curves: a 2-process job stopped after a checkpoint and resumed on 1
process, next to the uninterrupted 2-process job. all-MiniLM-L6-v2 with its dropout (0.1) on.

    python bench/elastic_curve.py --record lab/benchmarks/results.jsonl    # then: python -m lab.results

With dropout on, another world size draws other masks (the streams are derived from seed, step and rank),
so the curves are not bitwise equal after the resume; they should follow the same distribution. With
dropout off the final weights agree within 1e-5 (tests/test_elastic.py).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from bench.common import ENV, ROOT, git_commit, minilm, output_arguments, quickstart_data, write_result
from operator_cli import constants as C
from operator_cli.local import plan_replicas
from operator_cli.local.run import free_port
from operator_cli.render import render
from operator_cli.spec import JobSpec


def _pods(root: Path, text: str, nodes: int) -> tuple[list[subprocess.Popen], Path]:
    """The job's pods as `colbert-k8s local` replays them (the launcher's own environment, one workspace
    per pod); returns the processes and the master's workspace, the same for every number of nodes."""
    spec = JobSpec(name="elastic", config_text=text, nodes=nodes, gpus_per_node=0, pod_local_storage=True)
    (root / "config").mkdir(parents=True, exist_ok=True)
    (root / "config" / C.CONFIG_FILE).write_text(text)
    procs, replicas = [], plan_replicas(render(spec), root / "ws", root / "config", "127.0.0.1", free_port())
    for r in replicas:
        r.cwd.mkdir(parents=True, exist_ok=True)
        log = open(r.cwd / "log.txt", "a")  # noqa: SIM115 (closed with the process)
        procs.append(
            subprocess.Popen(
                r.command, cwd=r.cwd, env={**ENV, **r.env, "OMP_NUM_THREADS": "1"}, stdout=log, stderr=subprocess.STDOUT
            )
        )
    return procs, replicas[0].cwd


def _losses(ws: Path) -> dict[int, float]:
    out = {}
    for line in (ws / "out" / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "train/loss" in row:
            out[row["step"]] = row["train/loss"]  # a resumed run appends: the newest value of a step wins
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--stop-after", type=int, default=12, help="the checkpoint the job is killed after")
    parser.add_argument("--workdir", type=Path, default=ROOT / "runs" / "elastic_curve")
    output_arguments(parser, "elastic-curve")
    args = parser.parse_args()
    data = quickstart_data(ROOT / "data" / "quickstart")
    cfg = {
        "model": {"name_or_path": minilm(), "query_length": 32, "document_length": 96},
        "data": {"train": {"path": str(data)}},
        "training": {"global_batch_size": 16, "max_steps": args.steps, "learning_rate": 5e-5, "log_every": 1},
        "checkpoint": {"every_steps": args.stop_after, "keep_last": 2},
        "evaluation": {"after_training": False},
        "output_dir": "out",
    }
    text = yaml.safe_dump(cfg)
    procs, ref = _pods(args.workdir / "uninterrupted", text, 2)
    assert [p.wait() for p in procs] == [0, 0], (ref / "log.txt").read_text()[-2000:]
    procs, run = _pods(args.workdir / "resumed", text, 2)
    target = run / "out" / "checkpoints" / f"step-{args.stop_after:08d}"
    while not target.is_dir():
        assert all(p.poll() is None for p in procs), (run / "log.txt").read_text()[-2000:]
        time.sleep(0.1)
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait()
    procs, again = _pods(args.workdir / "resumed", text, 1)  # 1 process now; the master keeps its workspace
    assert again == run and procs[0].wait() == 0, (run / "log.txt").read_text()[-2000:]
    a, b = _losses(ref), _losses(run)
    result = {
        "commit": git_commit(),
        "stop_after": args.stop_after,
        "uninterrupted": a,
        "resumed": b,
        "before_resume_identical": all(a[s] == b[s] for s in a if s <= args.stop_after),
    }
    write_result(result, args)
    print(f"identical before the resume: {result['before_resume_identical']}")


if __name__ == "__main__":
    main()
