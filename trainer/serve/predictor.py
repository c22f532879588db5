"""The KServe predictor: :class:`trainer.serve.engine.Engine` behind KServe's Python model server.

``python -m trainer.serve URI [--model-name colbert] [--http-port 8080] [--exact]`` (what ``colbert-k8s serve
--local`` and the InferenceService's container run). The model and its index are loaded before the server
listens, so ``GET /v1/models/NAME`` (the readiness probe) answers 200 only once both are in memory.

* v1: ``POST /v1/models/NAME:predict`` with ``{"instances": [{"query": "...", "k": 10}]}`` answers
  ``{"predictions": [{"ids": [...], "scores": [...]}]}``; with ``{"instances": [{"query": "...", "documents":
  [...]}]}`` (rerank) ``{"predictions": [{"scores": [...]}]}``.
* v2 (Open Inference): ``POST /v2/models/NAME/infer`` with the same fields as named tensors: ``query`` (BYTES),
  ``k`` (INT32) or ``documents`` (BYTES); the outputs are ``ids`` (BYTES) and ``scores`` (FP32).
* A bad request (malformed JSON, an empty query, a k out of range, a body over
  :data:`trainer.serve.requests.MAX_BODY`) is HTTP 400 with ``{"error": "one line"}``, and the server goes on.
* Batching (``trainer/serve/batcher.py``): concurrent requests, v1 and v2, are answered together, one encode
  and one search a batch, in a worker thread, so health checks are answered meanwhile. ``--batch-wait-ms``
  (default 2), ``--batch-size`` (texts, default 256) and ``--queue`` (requests waiting, default 64), or
  ``COLBERT_SERVE_BATCH_WAIT_MS``, ``COLBERT_SERVE_BATCH_SIZE``, ``COLBERT_SERVE_QUEUE``; past the queue a request
  is HTTP 503 with ``{"error": "one line"}`` and ``Retry-After``, at once.

kserve is imported only here (the ``serve`` extra, in ``.venv-serve``): it pins python-dateutil<3, which the
CLI's kubernetes client refuses.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import uuid

from trainer.config.schema import ConfigError
from trainer.serve.batcher import Batcher, BatchOptions, Overloaded, add_batch_arguments, batch_options
from trainer.serve.requests import MAX_BODY, BadRequest, parse_v1, parse_v2, v1_answer, v2_outputs

__all__ = ["main"]

log = logging.getLogger("trainer.serve")


def _flat(values) -> list:
    """A v2 tensor's data as a flat list, bytes decoded (a JSON body nests BYTES by shape only sometimes)."""
    out: list = []
    for v in values if isinstance(values, (list, tuple)) else [values]:
        if isinstance(v, (list, tuple)):
            out.extend(_flat(v))
        else:
            out.append(v.decode("utf-8", "replace") if isinstance(v, bytes) else v)
    return out


def _model_class():
    """The kserve.Model subclass, defined once kserve is imported."""
    import kserve
    from kserve.errors import InvalidInput
    from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse

    class ColbertModel(kserve.Model):
        """Search and rerank with one engine; a request is parsed, answered in a batch with the requests beside
        it (in a worker thread), and shaped."""

        def __init__(self, name: str, load, batching: BatchOptions):
            super().__init__(name)
            self._load, self.engine, self.batcher, self._batching = load, None, None, batching

        def load(self) -> bool:
            from trainer.serve.engine import texts_of

            self.engine = self._load()
            self.batcher = Batcher.of(self.engine.answer, self._batching, texts_of)
            self.ready = True
            return self.ready

        async def predict(self, payload, headers=None, response_headers=None):
            v2 = isinstance(payload, InferRequest)
            try:
                request = parse_v2({i.name: _flat(i.data) for i in payload.inputs}) if v2 else parse_v1(payload)
                result = await self.batcher.submit(request)
            except BadRequest as e:
                raise InvalidInput(str(e)) from None
            if not v2:
                return v1_answer(request, result)
            outputs = [
                InferOutput(name, shape, dtype, data) for name, shape, dtype, data in v2_outputs(request, result)
            ]
            return InferResponse(
                response_id=payload.id or str(uuid.uuid4()), model_name=self.name, infer_outputs=outputs
            )

    return ColbertModel


class _BodyLimit:
    """ASGI middleware: a body over ``limit`` bytes is a 400 before anything parses it (KServe has no limit)."""

    def __init__(self, app, limit: int = MAX_BODY):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length", b"0")
        chunks, size, more = [], int(declared) if declared.isdigit() else 0, True
        while more and size <= self.limit:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
            size = max(size, sum(map(len, chunks)))
        if size > self.limit:
            while more:  # read to its end (not kept), so the client, still sending, gets the answer
                more = (await receive()).get("more_body", False)
            return await _error(send, f"the body has more than {self.limit} bytes; send at most {self.limit}")
        body, sent = b"".join(chunks), False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


async def _error(send, line: str, status: int = 400) -> None:
    import json

    body = json.dumps({"error": line}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _OneLine(logging.Filter):
    """KServe logs a refused request with its traceback: one line is what it means (``bad request: ...``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from kserve.errors import InvalidInput

        if record.exc_info and isinstance(record.exc_info[1], InvalidInput):
            record.msg, record.args, record.exc_info = f"bad request: {record.exc_info[1]}", (), None
        return True


def _install_guards(app) -> None:
    """The body limit, and a v2 body that is not an inference request: 400 and one line (FastAPI says 422)."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from kserve.logging import logger

    logger.addFilter(_OneLine())

    def invalid(_request, exc: RequestValidationError):
        first = (exc.errors() or [{}])[0]
        if first.get("type") == "json_invalid":
            line = f"the body is not valid JSON ({first.get('ctx', {}).get('error', 'decode error')})"
        else:
            where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "the body"
            line = f"{where}: {first.get('msg', 'is not a valid inference request')}"
        return JSONResponse(status_code=400, content={"error": line.replace(chr(10), " ")[:300]})

    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(Overloaded, _overloaded)
    app.add_middleware(_BodyLimit)


def _overloaded(_request, exc: Overloaded):
    """The queue is full: 503 at once, one line, and when to retry (KServe's own handlers log a traceback)."""
    from fastapi.responses import JSONResponse

    log.warning("refused: %s", exc)
    return JSONResponse(status_code=503, content={"error": str(exc)}, headers={"Retry-After": "1"})


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer.serve", description=__doc__.splitlines()[0])
    p.add_argument("uri", help="an export (s3://BUCKET/PREFIX/, gs://, az://, a local copy) or a job's output_dir")
    p.add_argument("--model-name", default="colbert", help="the name in the URLs (default: colbert)")
    p.add_argument("--http-port", type=int, default=8080)
    p.add_argument(
        "--exact",
        action="store_true",
        default=os.environ.get("COLBERT_SERVE_EXACT") == "1",
        help="search by exact MaxSim over the stored corpus embeddings (or COLBERT_SERVE_EXACT=1)",
    )
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when a GPU is visible)")
    p.add_argument(
        "--cache-dir",
        default=os.environ.get("COLBERT_SERVE_CACHE", ".cache/colbert-k8s"),
        help="where a remote export is staged",
    )
    add_batch_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", force=True)
    try:
        import torch

        from trainer.serve.engine import Engine, locate

        batching = batch_options(args)
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        model_dir, index_dir = locate(args.uri, args.cache_dir)  # before the server: a bad URI is one line
        engine = Engine(model_dir, index_dir, args.exact, device)
        saved, sys.argv = sys.argv, sys.argv[:1]  # kserve parses sys.argv when imported: none of ours for it
        try:
            import kserve
            from kserve import model_server
        finally:
            sys.argv = saved
    except ConfigError as e:  # a bad URI, an export that does not verify, --exact without embeddings
        print(f"serve: error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        print(
            f"serve: error: {e.name} is not installed; run scripts/setup.sh (it creates .venv-serve), or pip "
            "install -r requirements-serve.txt",
            file=sys.stderr,
        )
        return 2
    model = _model_class()(args.model_name, lambda: engine, batching)
    model.load()
    _install_guards(model_server.app)
    print(f"serving {args.model_name} on http://127.0.0.1:{args.http_port}: {engine.describe()}", flush=True)
    kserve.ModelServer(http_port=args.http_port, enable_grpc=False, workers=1).start([model])
    return 0
