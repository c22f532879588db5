"""Helpers for the serving tests: a served job's output (a tiny model, a BEIR split, its PLAID index with the
corpus embeddings), and the predictor started as ``serve --local`` starts it, in ``.venv-serve``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.helpers import ROOT, free_port

SERVE_PYTHON = ROOT / ".venv-serve" / "bin" / "python"
SKIP_REASON = ".venv-serve (kserve) is absent: scripts/setup.sh train,test creates it"


def served_output(root: Path, tiny_model: Path, modules: int = 4) -> Path:
    """An output_dir as a finished job with ``index: {embeddings: true}`` leaves it (final model, index), built
    by the trainer's own index phase over a BEIR split of real docstrings."""
    import random

    from pylate import models

    from trainer.config.load import parse_config
    from trainer.index import build_and_evaluate
    from trainer.quickstart_data import TEST_MODULES, _triplets, write_beir
    from trainer.run.checkpoint import write_manifest

    rows = _triplets(TEST_MODULES[:modules], random.Random(0))
    write_beir(root / "beir", [(r["id"], r["positive"]) for r in rows], [(r["id"], r["query"]) for r in rows[:40]])
    out = root / "output"
    model = models.ColBERT(str(tiny_model), query_length=16, document_length=48)
    model.save(str(out / "final-model"))
    write_manifest(out / "final-model")
    cfg = parse_config(
        {
            "model": {"name_or_path": str(tiny_model), "query_length": 16, "document_length": 48},
            "data": {"train": {"path": "t.jsonl"}, "eval_beir": str(root / "beir")},
            "training": {"max_steps": 1},
            "index": {"embeddings": True},
            "output_dir": str(out),
        }
    )
    metrics = {"index": build_and_evaluate(str(out / "final-model"), cfg)}
    (out / "metrics.json").write_text(json.dumps(metrics))
    return out


class Predictor:
    """``colbert-k8s serve --local URI`` (the CLI of the main venv, which runs the predictor in .venv-serve) on a
    free port, waited for until it is ready; or, with ``standin``, the predictor around a stand-in engine
    (``tests/helpers/standin_predictor.py``), whose stdin takes ``stop``."""

    def __init__(
        self,
        uri: str = "",
        *args: str,
        name: str = "colbert",
        env: dict | None = None,
        timeout: float = 900,
        standin: bool = False,
    ):
        self.port, self.name = free_port(), name
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "operator_cli.cli", "serve", "--local", uri, "--port", str(self.port)]
        cmd += ["--model-name", name, *args]
        if standin:
            cmd = [str(SERVE_PYTHON), "-m", "tests.helpers.standin_predictor", str(self.port)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **(env or {})}
        self.log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"predictor-{self.port}.log", "w+")
        if standin:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        stdin = subprocess.PIPE if standin else None
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdin=stdin, stdout=self.log, stderr=subprocess.STDOUT, text=True
        )
        deadline = time.time() + timeout
        while not self.ready():
            if self.proc.poll() is not None or time.time() > deadline:
                self.close()
                raise RuntimeError(f"the predictor did not start: {self.output()[-3000:]}")
            time.sleep(0.3)

    def ready(self) -> bool:
        try:
            return self.get(f"/v1/models/{self.name}")[0] == 200
        except OSError:
            return False

    def get(self, path: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def post(self, path: str, body: bytes | dict, headers: dict | None = None) -> tuple[int, dict]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, method="POST", headers={"Content-Type": "application/json", **(headers or {})}
        )
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def v1(self, instances: list[dict]) -> tuple[int, dict]:
        return self.post(f"/v1/models/{self.name}:predict", {"instances": instances})

    def v2(self, inputs: list[dict]) -> tuple[int, dict]:
        return self.post(f"/v2/models/{self.name}/infer", {"inputs": inputs})

    def output(self) -> str:
        if self.log.closed:
            return Path(self.log.name).read_text()
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop_model(self) -> None:
        """The stand-in's model unloaded (``stop`` on its stdin), waited for until it says so."""
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        while "stopped" not in self.output():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the predictor ended: {self.output()[-3000:]}")
            time.sleep(0.1)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
