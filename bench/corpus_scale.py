"""The PLAID index at corpus scale: build time, peak memory and bytes on disk a document of the trainer's index
phase (``trainer/index.py``), and search latency in this process and through ``serve --local`` (open loop, 1 and
16 clients), at 10k, 100k and 1M documents.

    python bench/corpus_scale.py --workdir /tmp/corpus-scale [--sizes 10000,100000,1000000] [--clients 1,16]
        [--duration 20] [--rate 1] [--max-minutes 40] [--max-gib 12] [--record lab/benchmarks/results.jsonl]

What is real and what is not:

* the corpus is synthetic (``bench/serve.py``'s ``synthetic_beir``: words of the quickstart's docstrings, 20 to
  400 words, about 145 tokens a document once tokenized), 60 queries of 3 to 8 words from its documents;
* the encoder is a tiny BERT built from a config (2 layers, 32 wide, dropout 0.1) as a ColBERT with the usual
  128-dim projection: its embeddings have a real model's shape and count, so the index's bytes, the build's memory
  and fast-plaid's share of the build time are a real model's, but the encoding is far cheaper than a real
  model's (a 6-layer MiniLM costs tens of times more a token): build time here is a lower bound, and scales with
  the encoder on a real one. The scores mean nothing (an untrained model), so no quality is reported.

Each build runs in a child process, which reports its RSS before the build (imports, the corpus's text, the
model), its peak RSS from there (``VmHWM``, reset where the build starts), and the peak within each chunk
(:class:`ChunkPeaks`): the first chunk's k-means, then fast-plaid's updates as the index grows. A size is skipped,
with its projection recorded, when the last measured size's time and memory, scaled (:func:`projected`), pass
``--max-minutes`` or ``--max-gib``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import loadgen  # noqa: E402
from bench.common import ENV, ROOT, git_commit, output_arguments, provenance, tiny_bert, write_result  # noqa: E402
from bench.serve import MODES, Server, _drain, served_output, synthetic_beir  # noqa: E402
from trainer.retrieval.plaid import ENCODE_CHUNK  # noqa: E402

QUERIES = 60  # the index phase evaluates each through PyLate's PLAID search: enough to cycle through when served
ENCODER = "tiny BERT (2 layers, 32 wide) as a ColBERT, 128-dim"


def _rss_mb(field: str = "VmRSS") -> float:
    """This process's resident size now (``VmRSS``) or its peak (``VmHWM``), MiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(f"{field}:")) / 1024


def _reset_peak() -> None:
    """Start the peak (``VmHWM``) again from the resident size now: Linux's clear_refs 5, so that the corpus's
    generation before the build does not count as the build's."""
    Path("/proc/self/clear_refs").write_text("5")


class ChunkPeaks:
    """The largest resident size within each chunk of a build: a thread reads this process's RSS every ``every``
    seconds, and each chunk's end is marked where PyLate's ``PLAID.add_documents`` returns (from one add's end to
    the next's: the chunk's encoding and its add). ``VmHWM`` stays the true peak; this says where it falls,
    and how a late update's memory grows with the index."""

    def __init__(self, every: float = 0.5):
        self.every, self.samples, self.ends = every, [], []
        self._stop = threading.Event()

    def __enter__(self) -> ChunkPeaks:
        from pylate import indexes

        self._add = add = indexes.PLAID.add_documents

        def marked(index, *args, **kwargs):
            try:
                return add(index, *args, **kwargs)
            finally:
                self.ends.append(time.monotonic())

        indexes.PLAID.add_documents = marked
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        from pylate import indexes

        indexes.PLAID.add_documents = self._add
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), _rss_mb()))
            self._stop.wait(self.every)

    def peaks(self) -> list[int]:
        """MiB, a chunk: the largest sample from the previous chunk's end (the first: from the start) to its own."""
        starts = [float("-inf"), *self.ends[:-1]]
        return [
            round(max((rss for t, rss in self.samples if start < t <= end), default=0))
            for start, end in zip(starts, self.ends)
        ]


def build(workdir: Path, documents: int, chunk: int) -> dict:
    """In this (child) process: the synthetic corpus, then the index phase over it, ``chunk`` documents encoded
    at a time; what it cost."""
    import trainer.retrieval.plaid
    from trainer.evaluate import load_beir

    trainer.retrieval.plaid.ENCODE_CHUNK = chunk
    beir = synthetic_beir(workdir / f"synthetic-{documents}" / "beir", documents, queries=QUERIES)
    load_beir(beir)  # the corpus's text in memory, as the index phase holds it
    import pylate.models  # noqa: F401  (imports before the baseline)

    model = tiny_bert(workdir / "tiny-bert")
    before = _rss_mb()
    _reset_peak()
    started = time.perf_counter()
    with ChunkPeaks() as watched:
        out = served_output(workdir, beir, str(model), f"synthetic-{documents}-chunk-{chunk}", embeddings=False)
    metrics = json.loads((out / "index-metrics.json").read_text())
    return {
        "output": str(out),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "build_seconds": metrics["build_seconds"],
        "rss_before_mb": round(before),
        "peak_rss_mb": round(_rss_mb("VmHWM")),  # since the reset above: the build's own
        "index_mb": metrics["size_mb"],
        "tokens_per_document": metrics["tokens_per_document"],
        "chunk_seconds": metrics["chunk_seconds"],
        "chunk_peak_rss_mb": watched.peaks(),  # sampled every 0.5 s
    }


def in_process(out: Path, queries: list[str], requests: int) -> dict:
    """p50/p99 of one search (one query, k 10) at a time on the serving engine, in this process."""
    import torch

    from trainer.serve.engine import Engine, locate

    torch.set_num_threads(1)
    engine = Engine(*locate(str(out), out / "cache"), exact=False, device="cpu")
    engine.search(queries[:1], 10)
    took = []
    for i in range(requests):
        started = time.perf_counter()
        engine.search([queries[i % len(queries)]], 10)
        took.append(time.perf_counter() - started)
    ordered = sorted(took)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 1),
        "p99_ms": round(loadgen.percentile(ordered, 99) * 1000, 1),
    }


def served(out: Path, queries: list[str], args) -> list[dict]:
    """Open-loop cells through ``serve --local`` (PLAID), one a client count."""
    bodies = [{"instances": [{"query": q, "k": 10}]} for q in queries]
    server = Server(out, MODES["plaid"], device="cpu", threads=1)
    cells = []
    try:
        for body in bodies[:3]:
            _drain(server.url, body)
        for n in args.clients:
            _drain(server.url, bodies[0])
            cells.append(loadgen.run(server.url + ":predict", bodies, n, args.rate, args.duration))
            print(json.dumps(cells[-1]), flush=True)
    finally:
        server.close()
    return cells


def _updates_line(per_chunk: list[float]) -> Callable[[int], float]:
    """The straight line fitted to the updates' figures (each chunk's but the first, whose k-means is paid once),
    as a function of the chunk's index."""
    slope, intercept = statistics.linear_regression(range(1, len(per_chunk)), per_chunk[1:])
    return lambda i: intercept + slope * i


def projected(last: dict, documents: int) -> dict:
    """The last measured size's build scaled to ``documents``. Time: where the build recorded each chunk's seconds,
    the first chunk (k-means) once and the updates on the straight line fitted to theirs (an update costs more as
    the index grows), the rest (model load, evaluation) linearly; else the whole time linearly (a lower bound).
    Memory: where it recorded each chunk's peak, the larger of the build's peak (the first chunk's k-means, whose
    size is the chunk's, not the corpus's) and the last update's on the line fitted to the updates'; else its
    growth (the index and a chunk) with the index scaled, on top of the same baseline (an upper bound)."""
    scale = documents / last["documents"]
    growth = last["peak_rss_mb"] - last["rss_before_mb"]
    chunk = max(0.0, growth - last["index_mb"])
    seconds = last["wall_seconds"] * scale
    chunks = last.get("chunk_seconds") or []
    if len(chunks) >= 3:  # two updates or more: a slope
        update = _updates_line(chunks)
        updates = sum(update(i) for i in range(1, round(len(chunks) * scale)))
        seconds = chunks[0] + updates + (last["wall_seconds"] - sum(chunks)) * scale
    peak = last["rss_before_mb"] + chunk + last["index_mb"] * scale
    peaks = last.get("chunk_peak_rss_mb") or []
    if len(peaks) >= 3:  # the last update's peak on the line fitted to the updates', or the first chunk's k-means
        peak = max(last["peak_rss_mb"], *peaks, _updates_line(peaks)(round(len(peaks) * scale) - 1))
    return {
        "documents": documents,
        "skipped": True,
        "projected_minutes": round(seconds / 60, 1),
        "projected_peak_gib": round(peak / 1024, 1),
    }


def measure(args) -> list[dict]:
    from trainer.evaluate import load_beir

    runs = []
    for documents in sorted(args.sizes):
        measured = [r for r in runs if not r.get("skipped")]
        if measured:
            guess = projected(measured[-1], documents)
            if guess["projected_minutes"] > args.max_minutes or guess["projected_peak_gib"] > args.max_gib:
                print(f"{documents} documents not run: {json.dumps(guess)}", flush=True)
                runs.append(guess)
                continue
        loaded = os.getloadavg()[0]
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--workdir",
                str(args.workdir),
                "--build",
                str(documents),
                "--chunk",
                str(args.chunk),
            ],
            cwd=ROOT,
            env={**ENV, "OMP_NUM_THREADS": str(args.threads)},
            capture_output=True,
            text=True,
        )
        if child.returncode != 0:
            raise SystemExit(f"the build of {documents} documents failed:\n{child.stderr[-3000:]}")
        built = json.loads(child.stdout.strip().splitlines()[-1])
        print(json.dumps({"documents": documents, "built": built}), flush=True)  # kept if a search below fails
        out = Path(built.pop("output"))
        queries = load_beir(out.parent / f"synthetic-{documents}" / "beir").queries
        run = {"documents": documents, **built, "commit": git_commit()}
        run["index_bytes_per_document"] = round(run["index_mb"] * 2**20 / documents)
        run["in_process"] = in_process(out, queries, args.requests)
        run["served"] = served(out, queries, args)
        run["load"] = f"{loaded:.1f} to {os.getloadavg()[0]:.1f}"  # each size's own: sizes may be measured apart
        print(json.dumps(run), flush=True)
        runs.append(run)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True, help="corpora and indexes, built once a size")
    parser.add_argument("--sizes", default="10000,100000,1000000", help="corpus sizes, documents")
    parser.add_argument("--clients", default="1,16", help="client counts of the served cells")
    parser.add_argument("--rate", type=float, default=1.0, help="requests a second from each client")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds a served cell")
    parser.add_argument("--requests", type=int, default=200, help="in-process searches a size")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the build")
    parser.add_argument(
        "--chunk", type=int, default=ENCODE_CHUNK, help="documents encoded at a time (the index phase's)"
    )
    parser.add_argument("--max-minutes", type=float, default=40.0, help="skip a size projected to build longer")
    parser.add_argument("--max-gib", type=float, default=12.0, help="skip a size projected to peak higher")
    parser.add_argument("--build", type=int, help=argparse.SUPPRESS)  # the child: build this size, print its costs
    output_arguments(parser, "corpus-scale")
    args = parser.parse_args()
    if args.build:
        print(json.dumps(build(args.workdir, args.build, args.chunk)))
        return
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.clients = [int(c) for c in args.clients.split(",")]
    loaded = os.getloadavg()[0]
    runs = measure(args)
    result = {
        **provenance(loaded),
        "encoder": ENCODER,
        "corpus": "synthetic (quickstart docstring words, 20-400 words a document)",
        "chunk": args.chunk,
        "rate": args.rate,
        "duration": args.duration,
        "runs": runs,
    }
    print(json.dumps(result, indent=2))
    write_result(result, args)


if __name__ == "__main__":
    main()
