"""The predictor's speed (``colbert-k8s serve --local``): queries per second and p50/p99 latency of search through
the PLAID index, of search by exact MaxSim, and of rerank, with 1 and 8 concurrent clients, over real HTTP.

    python bench/serve.py --workdir /tmp/serve-bench [--requests 200] [--rerank-documents 20]

The served model is all-MiniLM-L6-v2 as a ColBERT (the packaged copy, untrained projection: speed does not
depend on training), its corpus the quickstart's held-out split (343 docstrings, 300 queries), indexed by the
trainer's own index phase with ``index.embeddings`` on. Each client sends one query a request (k 10), cycling
through the split's queries; rerank sends a query and ``--rerank-documents`` texts. Prints a Markdown table
(what docs/benchmarks.md holds) and writes ``serve.json`` into the workdir. For each search, the server's
overhead at 1 client: the median latency over HTTP against the same search on an engine in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import ENV, ROOT, free_port, git_commit, minilm, quickstart_data  # noqa: E402


def served_output(workdir: Path) -> tuple[Path, list[str], list[str]]:
    """A job's output_dir (the model and its index with stored embeddings), the queries and the corpus."""
    from pylate import models

    from trainer.config.load import parse_config
    from trainer.evaluate import load_beir
    from trainer.index import build_and_evaluate
    from trainer.run.checkpoint import write_manifest

    quickstart_data(workdir / "data")
    split = load_beir(workdir / "data" / "beir")
    out = workdir / "output"
    if not (out / "index" / "manifest.json").is_file():
        models.ColBERT(minilm()).save(str(out / "final-model"))
        write_manifest(out / "final-model")
        cfg = parse_config(
            {
                "data": {"train": {"path": "t.jsonl"}, "eval_beir": str(workdir / "data" / "beir")},
                "training": {"max_steps": 1},
                "index": {"embeddings": True},
                "output_dir": str(out),
            }
        )
        build_and_evaluate(str(out / "final-model"), cfg)
    return out, split.queries, split.corpus


class Server:
    """``colbert-k8s serve --local`` on a free port, until it answers ready."""

    def __init__(self, out: Path, exact: bool):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1/models/colbert"
        cmd = [sys.executable, "-m", "operator_cli.cli", "serve", "--local", str(out), "--port", str(self.port)]
        env = {**ENV, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "2"}
        self.proc = subprocess.Popen(
            cmd + (["--exact"] if exact else []),
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 600
        while time.time() < deadline and self.proc.poll() is None:
            try:
                urllib.request.urlopen(self.url, timeout=5)
                return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("the predictor did not start")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def _post(url: str, body: dict) -> float:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url + ":predict", data=data, headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=300) as answer:
        answer.read()
    return time.perf_counter() - started


def load(url: str, bodies: list[dict], clients: int, requests: int) -> dict:
    """``requests`` requests from ``clients`` threads, each request waiting for its answer; qps and latency."""
    _post(url, bodies[0])  # warm-up: the first request pays for lazy initialisation
    latencies: list[float] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        for i in range(c, requests, clients):
            took = _post(url, bodies[i % len(bodies)])
            with lock:
                latencies.append(took)

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    ordered = sorted(latencies)
    return {
        "clients": clients,
        "requests": len(latencies),
        "qps": round(len(latencies) / wall, 2),
        "p50_ms": round(statistics.median(ordered) * 1000, 1),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000, 1),
    }


SERVER_THREADS = 2  # OMP_NUM_THREADS of the server, and torch's threads for the in-process side


def overhead(url: str, out: Path, exact: bool, bodies: list[dict], requests: int) -> dict:
    """The server's overhead at 1 client: the median latency of ``requests`` searches over HTTP, one at a time,
    and of the same searches called on an :class:`Engine` in this process, interleaved (one over HTTP, the same
    in-process, the next...) so that whatever else loads the machine weighs on both alike."""
    import torch

    from trainer.serve.engine import Engine, locate

    torch.set_num_threads(SERVER_THREADS)
    engine = Engine(*locate(str(out), out / "cache"), exact=exact, device="cpu")
    engine.search([bodies[0]["instances"][0]["query"]], 10)  # warm-up, as the server had
    over_http, local = [], []
    for i in range(requests):
        body = bodies[i % len(bodies)]
        over_http.append(_post(url, body))
        started = time.perf_counter()
        engine.search([body["instances"][0]["query"]], body["instances"][0]["k"])
        local.append(time.perf_counter() - started)
    http_ms, local_ms = statistics.median(over_http) * 1000, statistics.median(local) * 1000
    return {
        "in_process_p50_ms": round(local_ms, 1),
        "http_p50_ms": round(http_ms, 1),
        "ratio": round(http_ms / local_ms, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=200, help="requests per (mode, clients) cell")
    parser.add_argument("--rerank-documents", type=int, default=20)
    args = parser.parse_args()
    out, queries, corpus = served_output(args.workdir)
    searches = [{"instances": [{"query": q, "k": 10}]} for q in queries]
    reranks = [
        {"instances": [{"query": q, "documents": corpus[i : i + args.rerank_documents]}]} for i, q in enumerate(queries)
    ]
    rows, overheads = [], []
    for mode, exact, bodies in (
        ("search, PLAID", False, searches),
        ("search, exact MaxSim", True, searches),
        ("rerank", False, reranks),
    ):
        server = Server(out, exact)
        try:
            for clients in (1, 8):
                rows.append({"mode": mode, **load(server.url, bodies, clients, args.requests)})
                print(json.dumps(rows[-1]), flush=True)
            if mode.startswith("search"):
                overheads.append({"mode": mode, **overhead(server.url, out, exact, bodies, args.requests)})
                print(json.dumps(overheads[-1]), flush=True)
        finally:
            server.close()
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    result = {
        "date": str(date.today()),
        "commit": git_commit(),
        "machine": machine,
        "documents": len(corpus),
        "rows": rows,
        "overhead": overheads,
    }
    (args.workdir / "serve.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{result['date']}, commit {result['commit']}, {machine}, {len(corpus)} documents\n")
    print("| request | clients | requests | queries/s | p50 ms | p99 ms |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['clients']} | {r['requests']} | {r['qps']} | {r['p50_ms']} | {r['p99_ms']} |")
    print("\n| search, 1 client | in-process p50 ms | over HTTP p50 ms | server overhead |\n|---|---|---|---|")
    for r in overheads:
        print(f"| {r['mode']} | {r['in_process_p50_ms']} | {r['http_p50_ms']} | {r['ratio']}x |")


if __name__ == "__main__":
    main()
