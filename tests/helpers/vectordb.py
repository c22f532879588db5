"""Helpers for the vector-database tests: a small BEIR split of real docstrings (titles and metadata fields on
some rows), a saved PyLate ColBERT of the tiny BERT, exact MaxSim computed by hand, a stand-in Qdrant server
that answers every request with one fixed status (a refused key, a redirect), and a stand-in Milvus server
that refuses every gRPC call as unauthenticated."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

__all__ = ["Answering", "RefusingMilvus", "exact_top", "save_colbert", "write_corpus"]


def write_corpus(root: Path, documents: int = 40, queries: int = 8) -> Path:
    """A BEIR directory: ``documents`` docstrings (every third with a title, every fourth with a
    ``metadata`` object), ``queries`` queries each judging its own document relevant."""
    import random

    from trainer.quickstart_data import TEST_MODULES, _triplets

    rows = _triplets(TEST_MODULES[:4], random.Random(0))[:documents]
    assert len(rows) == documents
    (root / "qrels").mkdir(parents=True)
    with (root / "corpus.jsonl").open("w") as f:
        for i, r in enumerate(rows):
            row = {"_id": r["id"], "text": r["positive"]}
            if i % 3 == 0:
                row["title"] = f"title {i}"
            if i % 4 == 0:
                row["metadata"] = {"module": r["id"].split(":")[0], "n": i}
            f.write(json.dumps(row) + "\n")
    with (root / "queries.jsonl").open("w") as f:
        f.writelines(json.dumps({"_id": f"q{i}", "text": r["query"]}) + "\n" for i, r in enumerate(rows[:queries]))
    (root / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\t{r['id']}\t1\n" for i, r in enumerate(rows[:queries]))
    )
    return root


def save_colbert(tiny_model: Path, where: Path) -> Path:
    """A PyLate ColBERT of the tiny BERT, saved once: its projection is then the same on every load (and, seeded,
    on every run)."""
    import torch
    from pylate import models

    torch.manual_seed(0)
    models.ColBERT(str(tiny_model), query_length=16, document_length=48).save(str(where))
    return where


def exact_top(model, root: Path, k: int = 10, pool_factor: int = 1) -> list[list[str]]:
    """Each judged query's top ``k`` document ids by MaxSim over PyLate's own vectors, computed here with numpy:
    the reference the database's search is held to."""
    corpus = [json.loads(line) for line in (root / "corpus.jsonl").read_text().splitlines()]
    texts = [f"{d['title']} {d['text']}" if d.get("title") else d["text"] for d in corpus]
    docs = model.encode(texts, is_query=False, pool_factor=pool_factor, show_progress_bar=False)
    qids = [line.split("\t")[0] for line in (root / "qrels" / "test.tsv").read_text().splitlines()[1:]]
    by_id = {
        json.loads(line)["_id"]: json.loads(line)["text"] for line in (root / "queries.jsonl").read_text().splitlines()
    }
    found = []
    for q in model.encode([by_id[q] for q in qids], is_query=True, show_progress_bar=False):
        scores = [float((np.asarray(q) @ np.asarray(d).T).max(axis=1).sum()) for d in docs]  # MaxSim
        order = sorted(range(len(docs)), key=lambda i: (-scores[i], i))[:k]
        found.append([corpus[i]["_id"] for i in order])
    return found


class Answering:
    """An HTTP server on 127.0.0.1 that answers every request with ``status`` (and ``Location`` for a redirect),
    recording the ``api-key`` header each request carried."""

    def __init__(self, status: int, location: str = "https://elsewhere.example/"):
        seen: list[str | None] = []
        self.keys = seen

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _answer(self) -> None:
                seen.append(self.headers.get("api-key"))
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                body = json.dumps({"status": {"error": "stand-in"}}).encode()
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", location)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_PUT = do_POST = do_DELETE = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class RefusingMilvus:
    """A gRPC server on 127.0.0.1 that answers every call ``UNAUTHENTICATED``, as a Milvus server with
    authentication answers a missing or wrong token, recording each call's method and ``authorization``
    metadata. With ``cert`` (a trustme certificate for 127.0.0.1) it serves TLS, as ``milvus://`` expects."""

    def __init__(self, cert=None):
        from concurrent import futures

        import grpc

        seen: list[tuple[str, str | None]] = []
        self.calls = seen

        class Refuse(grpc.GenericRpcHandler):
            def service(self, details):
                seen.append((details.method, dict(details.invocation_metadata).get("authorization")))

                def refuse(request, context):
                    context.abort(
                        grpc.StatusCode.UNAUTHENTICATED, "auth check failure, please check username and password"
                    )

                return grpc.unary_unary_rpc_method_handler(refuse)

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((Refuse(),))
        if cert is None:
            self.port = self.server.add_insecure_port("127.0.0.1:0")
        else:
            pair = (cert.private_key_pem.bytes(), b"".join(p.bytes() for p in cert.cert_chain_pems))
            self.port = self.server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([pair]))
        self.server.start()

    def close(self) -> None:
        self.server.stop(grace=None)
