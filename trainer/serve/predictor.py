"""The KServe predictor: :class:`trainer.serve.engine.Engine` behind KServe's Python model server.

``python -m trainer.serve URI [--model-name colbert] [--host 0.0.0.0] [--http-port 8080] [--exact]
[--onnx fp32|int8 [--allow-int8-loss] | --precision bf16]`` (what
``colbert-k8s serve --local`` runs, on 127.0.0.1, and the InferenceService's container). The model and its
index are loaded before the server listens, so ``GET /v1/models/NAME`` (the readiness probe) answers 200 only
once both are in memory.

* v1: ``POST /v1/models/NAME:predict`` with ``{"instances": [{"query": "...", "k": 10}]}`` answers
  ``{"predictions": [{"ids": [...], "scores": [...], "found": n}]}``; with ``{"instances": [{"query": "...",
  "documents": [...]}]}`` (rerank) ``{"predictions": [{"scores": [...]}]}``.
* v2 (Open Inference): ``POST /v2/models/NAME/infer`` with the same fields as named tensors
  (:data:`trainer.serve.requests.V2_INPUTS`); the outputs are ``ids``, ``scores`` and ``found``.
* Only :data:`ROUTES` are answered; liveness (``GET /``) fails once the model is not loaded.
* A bad request (not JSON, an empty query, a k out of range, a tensor twice, a body over
  :data:`trainer.serve.requests.MAX_BODY`) is HTTP 400 with ``{"error": "one line"}``, logged at INFO as one
  line, and the server goes on.
* Batching (``trainer/serve/batcher.py``): concurrent requests, v1 and v2, are answered together, one encode
  and one search a batch, each in a worker thread (a batch is encoded while the one before is searched), so
  health checks are answered meanwhile. ``--batch-wait-ms``
  (default 2), ``--batch-size`` (texts, default 256) and ``--queue`` (requests waiting, default 64), or
  ``COLBERT_SERVE_BATCH_WAIT_MS``, ``COLBERT_SERVE_BATCH_SIZE``, ``COLBERT_SERVE_QUEUE``; past the queue a request
  is HTTP 503 with ``{"error": "one line"}`` and ``Retry-After``, at once.

kserve is imported only here (the ``serve`` extra, in ``.venv-serve``): it pins python-dateutil<3, which the
CLI's kubernetes client refuses.
"""

from __future__ import annotations

import logging
import re
import sys
import uuid
import warnings

from trainer.config.schema import ConfigError
from trainer.serve.batcher import Batcher, BatchOptions, Overloaded
from trainer.serve.options import parse
from trainer.serve.requests import (
    MAX_BODY,
    V2_INPUTS,
    V2_OUTPUTS,
    BadRequest,
    Search,
    not_json,
    parse_v1,
    parse_v2,
    v1_answer,
    v2_outputs,
)

__all__ = ["ROUTES", "main", "make_model", "serve"]

log = logging.getLogger("trainer.serve")

ROUTES = (
    ("GET", "/"),  # liveness: 200 while the model is loaded, else 503 (the kubelet restarts the pod)
    ("GET", "/metrics"),  # Prometheus
    ("GET", "/v1/models/{model_name}"),  # readiness
    ("POST", "/v1/models/{model_name}:predict"),
    ("GET", "/v2/health/live"),  # liveness, as "/"
    ("GET", "/v2/health/ready"),
    ("GET", "/v2/models/{model_name}"),  # metadata: the input and output tensors
    ("GET", "/v2/models/{model_name}/ready"),
    ("POST", "/v2/models/{model_name}/infer"),
)
"""Every route the predictor answers (docs/serving.md lists them; HEAD too where GET is). KServe's others (its
model repository's load and unload, ``:explain``, versions, the OpenAPI schema) are refused with a 404 before
KServe sees the request: KServe has no option that leaves them out, and FastAPI's included routers are not a
list this module could cut."""
_ROUTE_PATTERNS = [
    (method, re.compile(re.escape(path).replace(re.escape("{model_name}"), "[^/]+") + "$")) for method, path in ROUTES
]
_LIVENESS = ("/", "/v2/health/live")


def _documented(method: str, path: str) -> bool:
    method = "GET" if method == "HEAD" else method
    return any(m == method and pattern.match(path) for m, pattern in _ROUTE_PATTERNS)


def make_model(name: str, load, batching: BatchOptions | None = None):
    """The kserve.Model that answers with the engine ``load()`` returns, concurrent requests in batches
    (``batching``: the batcher's bounds, its defaults when None); kserve is imported here."""
    kserve = _import_kserve()
    from kserve.errors import InvalidInput
    from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse

    class ColbertModel(kserve.Model):
        """Search and rerank with one engine; a request is parsed, answered in a batch with the requests beside
        it (through the engine's stages, in worker threads), and shaped."""

        def __init__(self):
            super().__init__(name)
            # not ``engine``: kserve.Model's own attribute of that name starts and stops other model servers
            self._load, self.colbert, self.batcher, self._told_short = load, None, None, False

        def load(self) -> bool:
            from trainer.serve.engine import texts_of

            self.colbert = self._load()
            self.batcher = Batcher.of(self.colbert.stages, batching or BatchOptions(), texts_of)
            self.ready = True
            return self.ready

        def stop(self) -> None:
            """What KServe calls to unload a model: the liveness probe fails from then on."""
            self.ready, self.colbert = False, None

        @property
        def loaded(self) -> bool:
            return self.ready and self.colbert is not None

        def get_input_types(self) -> list[dict]:
            return [dict(t) for t in V2_INPUTS]

        def get_output_types(self) -> list[dict]:
            return [dict(t) for t in V2_OUTPUTS]

        def _tell_short(self, request, result) -> None:
            """Say once, in the log, that PLAID answered a query with fewer than k (its answer says how many)."""
            want = min(request.k, self.colbert.documents)
            short = [len(ids) for ids, _ in result if len(ids) < want]
            if short and not self._told_short:
                self._told_short = True
                log.warning(
                    "PLAID found fewer than k for a query (%d of %d asked): it scores a bounded set of candidates; "
                    "each answer says how many it found (found), and --exact returns the full top k (said once)",
                    min(short),
                    want,
                )

        async def predict(self, payload, headers=None, response_headers=None):
            v2 = isinstance(payload, InferRequest)
            try:
                if v2:
                    tensors = [
                        {"name": i.name, "shape": list(i.shape), "datatype": i.datatype, "data": i.data}
                        for i in payload.inputs
                    ]
                    request = parse_v2(tensors)
                else:
                    request = parse_v1(payload)
                result = await self.batcher.submit(request)
            except BadRequest as e:
                raise InvalidInput(str(e)) from None
            if isinstance(request, Search):
                self._tell_short(request, result)
            if not v2:
                return v1_answer(request, result)
            outputs = [
                InferOutput(name, shape, dtype, data) for name, shape, dtype, data in v2_outputs(request, result)
            ]
            return InferResponse(
                response_id=payload.id or str(uuid.uuid4()), model_name=self.name, infer_outputs=outputs
            )

    return ColbertModel()


_BINARY_LENGTH = "inference-header-content-length"  # the v2 binary extension's header


def _binary_problem(body: bytes, length: str) -> str | None:
    """The v2 binary extension: a JSON part of ``Inference-Header-Content-Length`` bytes, then the tensors' bytes.
    KServe reads it outside any guard (a bad length, a missing field, a short tensor: a 500), so it is read here
    first, by KServe's own reader: what fails is the client's request."""
    from kserve.protocol.infer_type import InferRequest

    if not re.fullmatch(r"[0-9]{1,12}", length) or int(length) > len(body):
        return (
            f"Inference-Header-Content-Length must be the byte length of the body's JSON part (0 to {len(body)}), "
            f"got {length[:40]!r}"
        )
    try:
        InferRequest.from_bytes(body, int(length), "colbert")
    except Exception as e:  # any failure to read the client's bytes is the client's
        detail = (str(e).splitlines() or [""])[0][:200]
        return f"the v2 binary request cannot be read ({type(e).__name__}: {detail}); check its sizes and tensors"
    return None


def _body_problem(scope, body: bytes) -> str | None:
    """What is wrong with a predict or infer body before KServe parses it, in one line; None: nothing."""
    import orjson

    path = scope.get("path", "")
    if scope.get("method") != "POST" or not (path.endswith(":predict") or path.endswith("/infer")):
        return None
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
    if path.endswith("/infer") and _BINARY_LENGTH in headers:
        return _binary_problem(body, headers[_BINARY_LENGTH].strip())
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError as e:  # one wording for v1 and v2 (KServe words v1's its own way)
        return not_json(str(e))
    return None


class _Gate:
    """ASGI middleware before KServe's routes: a route not in :data:`ROUTES` is a 404; liveness is a 503 once the
    model is not loaded (KServe's says alive whatever the model); a body over ``limit`` bytes (KServe has no
    limit), a body that is not JSON, a v2 binary header that does not add up: a 400 and one line before
    anything else parses it."""

    def __init__(self, app, model, limit: int = MAX_BODY):
        self.app, self.model, self.limit = app, model, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        method, path = scope.get("method", ""), scope.get("path", "")
        if not _documented(method, path):
            return await _error(send, f"{method} {path[:200]!r} is not a route of this server", 404)
        if path in _LIVENESS and not self.model.loaded:
            log.warning("liveness: the model %s is not loaded; answering 503, so the pod is restarted", self.model.name)
            return await _error(send, f"the model {self.model.name} is not loaded", 503)
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
        if problem := _body_problem(scope, body):
            return await _error(send, problem)

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


async def _error(send, line: str, status: int = 400) -> None:
    import json

    if status < 500:
        log.info("bad request: %s", line)
    body = json.dumps({"error": line}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _OneLine(logging.Filter):
    """KServe logs a client's mistake (a refused request, an unknown model) at ERROR with its traceback: one
    line at INFO is what it means (``bad request: ...``); a server's own faults keep their level."""

    def filter(self, record: logging.LogRecord) -> bool:
        from kserve.errors import InvalidInput, ModelNotFound

        if record.exc_info and isinstance(record.exc_info[1], (InvalidInput, ModelNotFound)):
            what = "bad request" if isinstance(record.exc_info[1], InvalidInput) else "not found"
            record.msg, record.args, record.exc_info = f"{what}: {record.exc_info[1]}", (), None
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


def _install(app, model) -> None:
    """The gate (routes, liveness, bodies), one-line logs, and a 400 (not FastAPI's 422) for a v2 body that is not
    an inference request."""
    from fastapi.exceptions import FastAPIDeprecationWarning, RequestValidationError
    from fastapi.responses import JSONResponse
    from kserve.logging import logger

    # KServe's app answers with FastAPI's ORJSONResponse, which FastAPI deprecates: KServe's to change, not ours
    warnings.filterwarnings("ignore", message="ORJSONResponse is deprecated", category=FastAPIDeprecationWarning)
    logger.addFilter(_OneLine())

    def invalid(_request, exc: RequestValidationError):
        first = (exc.errors() or [{}])[0]
        if first.get("type") == "json_invalid":
            line = not_json(str(first.get("ctx", {}).get("error", "")))
        else:
            where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "the body"
            line = f"{where}: {first.get('msg', 'is not a valid inference request')}"
        line = line.replace(chr(10), " ")[:300]
        log.info("bad request: %s", line)
        return JSONResponse(status_code=400, content={"error": line})

    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(Overloaded, _overloaded)
    app.add_middleware(_Gate, model=model)


def _overloaded(_request, exc: Overloaded):
    """The queue is full: 503 at once, one line, and when to retry (KServe's own handlers log a traceback)."""
    from fastapi.responses import JSONResponse

    log.warning("refused: %s", exc)
    return JSONResponse(status_code=503, content={"error": str(exc)}, headers={"Retry-After": "1"})


def serve(model, host: str, port: int) -> None:
    """KServe's model server for ``model`` on ``host:port``, answering only :data:`ROUTES`, until stopped."""
    kserve = _import_kserve()
    from kserve import model_server

    class Server(kserve.ModelServer):
        """KServe's, bound to ``host``: its REST server listens on 0.0.0.0 and takes no address."""

        def setup_event_loop(self) -> None:  # start() calls it after it builds the REST server, before it listens
            self._rest_server.config.host = host
            super().setup_event_loop()

    server = Server(http_port=port, enable_grpc=False, workers=1)
    _install(model_server.app, model)
    server.start([model])


def _import_kserve():
    """kserve, imported without our flags: it parses sys.argv when imported."""
    saved, sys.argv = sys.argv, sys.argv[:1]
    try:
        import kserve
        import kserve.model_server  # noqa: F401  (the app, and the parsing, happen here)
    finally:
        sys.argv = saved
    return kserve


def _url(host: str, port: int) -> str:
    """Where a client on this machine reaches ``host:port`` (0.0.0.0: every interface, this one included)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}" + (" (every interface)" if host in ("0.0.0.0", "::") else "")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", force=True)
    try:
        args = parse(argv)
        import torch

        from trainer.serve.engine import Engine, locate

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        model_dir, index_dir = locate(args.uri, args.cache_dir)  # before the server: a bad URI is one line
        engine = Engine(
            model_dir,
            index_dir,
            args.exact,
            device,
            onnx=args.onnx,
            allow_int8_loss=args.allow_int8_loss,
            precision=args.precision,
        )
        _import_kserve()
    except ConfigError as e:  # a bad variable or URI, an export that does not verify, --exact without embeddings
        print(f"serve: error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        print(
            f"serve: error: {e.name} is not installed; run scripts/setup.sh (it creates .venv-serve), or pip "
            "install -r requirements-serve.txt",
            file=sys.stderr,
        )
        return 2
    model = make_model(args.model_name, lambda: engine, args.batching)
    model.load()
    print(f"serving {args.model_name} on {_url(args.host, args.http_port)}: {engine.describe()}", flush=True)
    serve(model, args.host, args.http_port)
    return 0
