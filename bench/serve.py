"""The predictor under load (``colbert-k8s serve --local``, over real HTTP): queries per second, p50/p95/p99 latency
and errors of search through the PLAID index, search by exact MaxSim, and rerank with the PyTorch encoder and with
its ONNX export (fp32, written beside the model once), at 1, 8 and 32 clients, from an
open-loop load generator (``bench/loadgen.py``: each client sends ``--rate`` requests a second whatever the
answers, so queueing shows); the capacity of a closed loop (PLAID search at 1 and 8 clients, each rerank at 1); and the
server's overhead at 1 client, against the same search on an engine called in this process. It judges the serving
targets on those figures (8 clients at least 2x one client's PLAID throughput; the server at most 1.2x the
in-process engine; a 20-document rerank at least 5x 0.36 q/s; how far from 100 q/s at p99 under 50 ms, the goal
on a GPU) and prints each, met or not.

    python bench/serve.py --workdir /tmp/serve-bench [--duration 20] [--rate 1] [--clients 1,8,32] [--threads 1]
        [--data BEIR_FOLDER | --synthetic 10000] [--model PATH] [--modes plaid,exact,rerank,rerank-onnx]
        [--results bench/out]
        [--record lab/benchmarks/results.jsonl]

The served model is ``--model`` as a ColBERT (default all-MiniLM-L6-v2, the packaged copy, untrained projection:
speed does not depend on training); the corpus is ``--data`` (a BEIR folder), or ``--synthetic N`` documents
(synthetic: words drawn from the quickstart's docstrings, lengths spread around 120 words; for speed and memory,
not quality), or by default the quickstart's held-out split (343 docstrings, 300 queries); indexed by the
trainer's own index phase with ``index.embeddings`` on, once per workdir. A search request is one query, k 10,
cycling through the split's queries; a rerank, one query and ``--rerank-documents`` texts. The predictor batches
with its defaults, or what ``COLBERT_SERVE_*`` in the environment says. Writes ``serve.json``, ``serve.md`` (the
tables) and ``serve.png`` into ``--results`` (default ``bench/out/``, not tracked).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import loadgen  # noqa: E402
from bench.common import (  # noqa: E402
    ENV,
    ROOT,
    free_port,
    minilm,
    output_arguments,
    provenance,
    quickstart_data,
    write_result,
)

# Threads of the server (OMP_NUM_THREADS) and of the in-process engine. 1 by default: on a shared machine a
# thread pool wider than the cores left to it spins at every barrier (measured on the 2-core development machine
# under a load of 11: a 512 x 512 matmul took 10.5 ms on 1 thread, 57.7 ms on 2). Give a dedicated machine its cores.
DEFAULT_THREADS = 1


@dataclass(frozen=True)
class Mode:
    """A served configuration and what its requests are."""

    label: str  # in the tables
    kind: str  # "search" or "rerank"
    exact: bool = False  # served with --exact
    onnx: str | None = None  # served with --onnx FORM
    precision: str = "fp32"  # served with --precision
    capacity: tuple[int, ...] = ()  # clients of its closed-loop cells

    @property
    def server(self) -> tuple:
        """What tells its server apart: modes that agree share one."""
        return self.exact, self.onnx, self.precision


MODES = {
    "plaid": Mode("search, PLAID", "search", capacity=(1, 8)),
    "exact": Mode("search, exact MaxSim", "search", exact=True),
    "rerank": Mode("rerank", "rerank", capacity=(1,)),
    "rerank-onnx": Mode("rerank, ONNX fp32 encoder", "rerank", onnx="fp32", capacity=(1,)),
    "plaid-bf16": Mode("search, PLAID, bfloat16 encoder", "search", precision="bf16", capacity=(1, 8)),
    "rerank-bf16": Mode("rerank, bfloat16 encoder", "rerank", precision="bf16", capacity=(1,)),
}
RERANK_BEFORE = 0.36  # q/s of a 20-document rerank at 1 client, 343 documents, as recorded at commit c860112
GOAL_QPS, GOAL_P99_MS = 100, 50  # the serving goal on one GPU


def cell_label(mode: str, width: int) -> str:
    """A mode's label in the tables: a rerank's names its documents (``rerank, 20 documents, ...``)."""
    m = MODES[mode]
    return m.label.replace("rerank", f"rerank, {width} documents", 1) if m.kind == "rerank" else m.label


def synthetic_beir(folder: Path, documents: int, queries: int = 300, seed: int = 0) -> Path:
    """A synthetic BEIR split of ``documents`` documents: words drawn from the quickstart's docstrings at their
    own frequencies, 20 to 400 words each (log-normal around 120); each query 3 to 8 words of one document."""
    from trainer.quickstart_data import TEST_MODULES, TRAIN_MODULES, _triplets, write_beir

    if (folder / "corpus.jsonl").is_file():
        return folder
    rng = random.Random(seed)
    words = [w for r in _triplets(TRAIN_MODULES + TEST_MODULES, random.Random(0)) for w in r["positive"].split()]
    docs = []
    for i in range(documents):
        n = min(400, max(20, int(rng.lognormvariate(4.8, 0.5))))  # median e^4.8, about 120 words
        docs.append((f"syn-{i}", " ".join(rng.choices(words, k=n))))
    asked = []
    for doc_id, text in rng.sample(docs, min(queries, documents)):
        tokens = text.split()
        n = rng.randint(3, 8)
        at = rng.randrange(max(1, len(tokens) - n))
        asked.append((doc_id, " ".join(tokens[at : at + n])))
    write_beir(folder, docs, asked)
    return folder


SPEED_PRODUCT = (32, 128, 17_000)  # a 32-token query, 128 wide, against 17,000 document tokens: PLAID's product


def machine_speed(repeats: int = 15) -> dict:
    """Milliseconds of one fixed matrix product (``SPEED_PRODUCT``, the product at the heart of a PLAID search) on
    one CPU thread, in float32 and in float16, medians, with the product's shape. The same cores run it at other
    speeds from one hour to the next, so a run's absolute figures are read beside it; ratios measured within one
    run need no such help.

    >>> speed = machine_speed(repeats=1)
    >>> speed["shape"], sorted(speed["ms"])
    ([32, 128, 17000], ['float16', 'float32'])
    """
    import torch

    rows, width, columns = SPEED_PRODUCT
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        query, documents = torch.randn(rows, width), torch.randn(width, columns)
        speed = {}
        for name, dtype in (("float32", torch.float32), ("float16", torch.float16)):
            q, d = query.to(dtype), documents.to(dtype)
            q @ d  # warm-up
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                q @ d
                times.append(time.perf_counter() - start)
            speed[name] = round(statistics.median(times) * 1000, 2)
        return {"shape": list(SPEED_PRODUCT), "ms": speed}
    finally:
        torch.set_num_threads(threads)


def served_output(workdir: Path, beir: Path, model: str, tag: str, embeddings: bool = True) -> Path:
    """A job's output_dir for ``beir`` (the model and its index, with stored embeddings for ``--exact`` unless
    ``embeddings`` is off), built once a corpus (``tag``) and model."""
    from pylate import models

    from trainer.config.load import parse_config
    from trainer.index import build_and_evaluate
    from trainer.run.checkpoint import write_manifest

    out = workdir / f"output-{tag}-{Path(model).name}{'' if embeddings else '-plaid'}"
    if not (out / "index" / "manifest.json").is_file():
        models.ColBERT(model).save(str(out / "final-model"))
        write_manifest(out / "final-model")
        cfg = parse_config(
            {
                "data": {"train": {"path": "t.jsonl"}, "eval_beir": str(beir)},
                "training": {"max_steps": 1},
                "index": {"embeddings": embeddings},
                "output_dir": str(out),
            }
        )
        metrics = build_and_evaluate(str(out / "final-model"), cfg)
        (out / "index-metrics.json").write_text(json.dumps(metrics) + "\n")
    return out


class Server:
    """``colbert-k8s serve --local`` on a free port, until it answers ready."""

    def __init__(self, out: Path, mode: Mode, device: str, threads: int):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1/models/colbert"
        cmd = [sys.executable, "-m", "operator_cli.cli", "serve", "--local", str(out), "--port", str(self.port)]
        env = {**ENV, "OMP_NUM_THREADS": str(threads)}
        if device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        self.log = open(out.parent / f"server-{self.port}.log", "w")
        self.proc = subprocess.Popen(
            cmd
            + (["--exact"] if mode.exact else [])
            + (["--onnx", mode.onnx] if mode.onnx else [])
            + (["--precision", mode.precision] if mode.precision != "fp32" else []),
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 600
        while time.time() < deadline and self.proc.poll() is None:
            try:
                urllib.request.urlopen(self.url, timeout=5)
                return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"the predictor did not start; see {self.log.name}")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:  # still answering a queue: stop it
            self.proc.kill()
            self.proc.wait(60)
        self.log.close()


def _post(url: str, body: dict, timeout: float = 300) -> float:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url + ":predict", data=data, headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        answer.read()
    return time.perf_counter() - started


def _drain(url: str, body: dict, patience: float = 1800) -> None:
    """One request, answered once what the server holds (an earlier cell's queue: up to its ``max_queue`` slow
    requests) is done; 503s and timeouts are retried until ``patience`` seconds have passed."""
    import urllib.error

    deadline = time.time() + patience
    while True:
        try:
            _post(url, body, timeout=max(1.0, deadline - time.time()))
            return
        except (urllib.error.HTTPError, TimeoutError) as e:
            if (isinstance(e, urllib.error.HTTPError) and e.code != 503) or time.time() > deadline:
                raise
            time.sleep(1)


def overhead(url: str, out: Path, mode: Mode, device: str, threads: int, bodies: list[dict], requests: int) -> dict:
    """The server's overhead at 1 client: the median latency of ``requests`` searches over HTTP, one at a time,
    and of the same searches called on an :class:`Engine` in this process, interleaved (one over HTTP, the same
    in-process, the next...) so that whatever else loads the machine weighs on both alike."""
    import torch

    from trainer.serve.engine import Engine, locate

    torch.set_num_threads(threads)
    where = locate(str(out), out / "cache")
    engine = Engine(*where, exact=mode.exact, device=device, onnx=mode.onnx, precision=mode.precision)
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


def tables(result: dict) -> str:
    """The Markdown the results file holds: what ran where, the load cells, the overheads."""
    lines = [
        f"{result['date']}, commit `{result['commit']}`, {result['machine']}, device {result['device']} "
        f"(torch threads: {result['threads']}), load average {result['load']}; "
        f"{result['documents']} documents ({result['corpus']}); model {result['model']}; open loop, each client "
        f"{result['rate']} requests/s for {result['duration']} s a cell; batching: {result['batching']}.",
        "",
        "| request | clients | offered q/s | q/s | p50 ms | p95 ms | p99 ms | requests | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        errors = ", ".join(f"{k}: {v}" for k, v in r["errors"].items()) or "0"
        lines.append(
            f"| {r['mode']} | {r['clients']} | {r['offered_qps']} | {r['qps']} | {r['p50_ms']} | {r['p95_ms']} | "
            f"{r['p99_ms']} | {r['requests']} | {errors} |"
        )
    return "\n".join(lines + capacity_lines(result)) + "\n"


def capacity_lines(result: dict) -> list[str]:
    """The closed-loop capacities, the server's overhead, and the targets judged on them."""
    lines = []
    if result.get("capacity"):
        lines += ["", "| closed loop (next request on each answer) | clients | q/s | p50 ms | p99 ms | errors |"]
        lines.append("|---|---|---|---|---|---|")
        for r in result["capacity"]:
            errors = ", ".join(f"{k}: {v}" for k, v in r["errors"].items()) or "0"
            lines.append(f"| {r['mode']} | {r['clients']} | {r['qps']} | {r['p50_ms']} | {r['p99_ms']} | {errors} |")
    if result["overhead"]:
        lines += ["", "| search, 1 client, one at a time | in-process p50 ms | over HTTP p50 ms | server overhead |"]
        lines.append("|---|---|---|---|")
        for r in result["overhead"]:
            lines.append(f"| {r['mode']} | {r['in_process_p50_ms']} | {r['http_p50_ms']} | {r['ratio']}x |")
    if result.get("targets"):
        lines += ["", "| target | measured | met |", "|---|---|---|"]
        lines += [f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else '**no**'} |" for t in result["targets"]]
    return lines


def plot(result: dict, path: Path) -> None:
    """The run's plot, drawn as the results page draws the recorded one (lab/plots.py)."""
    from lab.plots import draw_serving

    draw_serving(result, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True, help="the data and the index, built once")
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "out")
    corpus = parser.add_mutually_exclusive_group()
    corpus.add_argument("--data", type=Path, help="a BEIR folder (corpus.jsonl, queries.jsonl, qrels/)")
    corpus.add_argument("--synthetic", type=int, metavar="N", help="N synthetic documents (speed and memory only)")
    parser.add_argument("--model", default=None, help="a ColBERT or sentence-transformers model (default MiniLM)")
    parser.add_argument("--modes", default=",".join(MODES), help="of " + ", ".join(MODES))
    parser.add_argument("--clients", default="1,8,32", help="client counts, one cell each")
    parser.add_argument("--rate", type=float, default=1.0, help="requests a second from each client")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds a cell")
    parser.add_argument("--rerank-documents", type=int, default=20)
    parser.add_argument("--overhead-requests", type=int, default=50, help="searches of the overhead measure")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="torch threads of the server")
    output_arguments(parser, "serving")
    args = parser.parse_args()
    loaded = os.getloadavg()[0]
    modes = [m.strip() for m in args.modes.split(",")]
    if unknown := [m for m in modes if m not in MODES]:
        parser.error(f"--modes: {unknown[0]!r} is not one of {', '.join(MODES)}")
    clients = [int(c) for c in args.clients.split(",")]

    from trainer.evaluate import load_beir

    if args.data:
        beir, name, tag = args.data, str(args.data), args.data.name
    elif args.synthetic:
        tag = f"synthetic-{args.synthetic}"
        beir, name = synthetic_beir(args.workdir / tag / "beir", args.synthetic), "synthetic"
    else:
        quickstart_data(args.workdir / "quickstart")
        beir, name, tag = args.workdir / "quickstart" / "beir", "the quickstart's held-out split", "quickstart"
    model = args.model or minilm()
    out = served_output(args.workdir, beir, model, tag)
    split = load_beir(beir)
    searches = [{"instances": [{"query": q, "k": 10}]} for q in split.queries]
    width = args.rerank_documents
    corpus = split.corpus
    reranks = [
        {"instances": [{"query": q, "documents": [corpus[(i * width + j) % len(corpus)] for j in range(width)]}]}
        for i, q in enumerate(split.queries)
    ]
    speed = machine_speed()  # before the load: the cores' speed this hour
    rows, overheads, capacity = measure(args, out, modes, clients, searches, reranks)
    device = "CPU" if args.device == "cpu" else _gpu_name()
    batching = ", ".join(f"{k}={v}" for k, v in os.environ.items() if k.startswith("COLBERT_SERVE_")) or "defaults"
    result = {
        **provenance(loaded),
        "device": device,
        "threads": args.threads,
        "machine_speed": speed,
        "documents": len(split.corpus),
        "corpus": name,
        "model": Path(args.model).name if args.model else "all-MiniLM-L6-v2 (packaged)",
        "rate": args.rate,
        "duration": args.duration,
        "batching": batching,
        "rerank_documents": width,
        "rows": rows,
        "overhead": overheads,
        "capacity": capacity,
    }
    result["targets"] = targets(result)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "serve.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.results / "serve.md").write_text(tables(result))
    plot(result, args.results / "serve.png")
    print("\n" + tables(result) + f"\nwritten: {args.results / 'serve.md'}, serve.json, serve.png")
    write_result(result, args)


def measure(args, out: Path, modes: list[str], clients: list[int], searches: list, reranks: list):
    """Every cell: the open-loop rows, the overheads at 1 client, and the closed-loop capacities the targets
    read (PLAID search at 1 and 8 clients, rerank at 1)."""
    rows, overheads, capacity = [], [], []
    width = args.rerank_documents
    for key in dict.fromkeys(MODES[m].server for m in modes):  # one server each, in MODES' order
        served = [m for m in modes if MODES[m].server == key]
        first = MODES[served[0]]
        if first.onnx and not (out / "final-model" / "onnx").is_dir():
            from trainer.onnx_export import export

            export(out / "final-model")  # the token check only: speed does not depend on the held-out split
        server = Server(out, first, args.device, args.threads)
        try:
            for mode in served:
                label, kind = cell_label(mode, width), MODES[mode].kind
                bodies = reranks if kind == "rerank" else searches
                for body in bodies[:3]:
                    _drain(server.url, body)  # warm-up: the first requests pay for lazy initialisation
                for n in clients:
                    _drain(server.url, bodies[0])  # the last cell's queue is done
                    cell = loadgen.run(server.url + ":predict", bodies, n, args.rate, args.duration)
                    rows.append({"mode": label, **cell})
                    print(json.dumps(rows[-1]), flush=True)
                for n in MODES[mode].capacity:
                    _drain(server.url, bodies[0])
                    cell = loadgen.saturate(server.url + ":predict", bodies, n, args.duration)
                    capacity.append({"mode": label, **cell})
                    print(json.dumps(capacity[-1]), flush=True)
                if kind == "search":
                    _drain(server.url, bodies[0])
                    cell = overhead(
                        server.url, out, MODES[mode], args.device, args.threads, bodies, args.overhead_requests
                    )
                    overheads.append({"mode": label, **cell})
                    print(json.dumps(overheads[-1]), flush=True)
        finally:
            server.close()
    return rows, overheads, capacity


def targets(result: dict) -> list[dict]:
    """The serving targets, each measured in this run: met or not, with the figures it was judged on. Each search
    mode with closed-loop cells at 1 and 8 clients is judged on the concurrency target, each rerank mode on the
    rerank target."""
    cap = {(c["mode"], c["clients"]): c for c in result["capacity"]}
    out = []
    searches = [m for m in MODES.values() if m.kind == "search" and m.capacity == (1, 8)]
    for m in searches:
        if (one := cap.get((m.label, 1))) and (eight := cap.get((m.label, 8))):
            ratio = eight["qps"] / one["qps"] if one["qps"] else math.inf
            out.append(
                {
                    "target": f"{m.label}: 8 clients at least 2x the 1-client throughput",
                    "measured": f"{eight['qps']} q/s at 8 clients, {one['qps']} at 1: {ratio:.2f}x",
                    "met": ratio >= 2,
                }
            )
    for o in result["overhead"]:
        if o["mode"] == MODES["plaid"].label:
            out.append(
                {
                    "target": "server overhead at 1 client at most 1.2x the engine called in-process",
                    "measured": f"{o['http_p50_ms']} ms over HTTP, {o['in_process_p50_ms']} in-process: {o['ratio']}x",
                    "met": o["ratio"] <= 1.2,
                }
            )
    for mode in (name for name, m in MODES.items() if m.kind == "rerank"):
        label = cell_label(mode, result["rerank_documents"])
        if (r := cap.get((label, 1))) and result["rerank_documents"] == 20:
            out.append(
                {
                    "target": f"{label} at 1 client at least 5x {RERANK_BEFORE} q/s",
                    "measured": f"{r['qps']} q/s: {r['qps'] / RERANK_BEFORE:.1f}x",
                    "met": r["qps"] >= 5 * RERANK_BEFORE,
                }
            )
    best = max((cap[(m.label, 8)] for m in searches if (m.label, 8) in cap), key=lambda c: c["qps"], default=None)
    if best:
        short = GOAL_QPS / best["qps"] if best["qps"] else math.inf
        out.append(
            {
                "target": f"the GPU goal: p99 under {GOAL_P99_MS} ms at {GOAL_QPS} q/s per GPU",
                "measured": f"{result['device']}: {best['qps']} q/s at {best['clients']} clients, {best['mode']} "
                f"(p99 {best['p99_ms']} ms), {short:.0f}x short of the rate",
                "met": best["qps"] >= GOAL_QPS and best["p99_ms"] < GOAL_P99_MS,
            }
        )
    return out


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cuda (none visible)"


if __name__ == "__main__":
    main()
