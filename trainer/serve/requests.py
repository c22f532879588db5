"""What a client may ask the predictor, parsed and checked before the model sees it: standard library only.

Two requests, in KServe's v1 and v2 (Open Inference) shapes:

* **search**: queries in, the top-k document ids with their scores out;
* **rerank**: one query and candidate texts in, one MaxSim score per text out.

Anything else is :class:`BadRequest`: one line that names the field and the fix, which the predictor answers
with HTTP 400. Limits keep one request from holding the server: :data:`MAX_K` results, :data:`MAX_INSTANCES`
queries, :data:`MAX_DOCUMENTS` texts to rerank, :data:`MAX_TEXT` characters a text, :data:`MAX_BODY` bytes
a body (checked by the server before it parses a byte).

>>> parse_v1({"instances": [{"query": "what is colbert?", "k": 3}]})
Search(queries=['what is colbert?'], k=3)
>>> parse_v1({"instances": [{"query": "q", "documents": ["a", "b"]}]})
Rerank(query='q', documents=['a', 'b'])
>>> try:
...     parse_v1({"instances": [{"query": " ", "k": 3}]})
... except BadRequest as e:
...     print(e)
instances[0].query is empty; send the query text
>>> parse_v2([{"name": "query", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]},
...           {"name": "k", "shape": [1], "datatype": "INT32", "data": [5]}])
Search(queries=['a', 'b'], k=5)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

__all__ = [
    "DEFAULT_K",
    "MAX_BODY",
    "MAX_DOCUMENTS",
    "MAX_INSTANCES",
    "MAX_K",
    "MAX_TEXT",
    "BadRequest",
    "Rerank",
    "Search",
    "V2_INPUTS",
    "V2_OUTPUTS",
    "not_json",
    "parse_v1",
    "parse_v2",
    "v1_answer",
    "v2_outputs",
]

DEFAULT_K = 10
MAX_K = 1000
MAX_INSTANCES = 64  # queries in one search request
MAX_DOCUMENTS = 1000  # texts in one rerank request
MAX_TEXT = 20_000  # characters in a query or a document (the model reads its first tokens only)
MAX_BODY = 4 << 20  # bytes of one request body

V2_INPUTS = (
    {"name": "query", "datatype": "BYTES", "shape": [-1]},
    {"name": "k", "datatype": "INT32", "shape": [1]},
    {"name": "documents", "datatype": "BYTES", "shape": [-1]},
)
"""The v2 input tensors (the model's metadata lists them): ``query``, and ``k`` (search) or ``documents``
(rerank). ``k`` may be any integer datatype."""
V2_OUTPUTS = (
    {"name": "ids", "datatype": "BYTES", "shape": [-1, -1]},
    {"name": "scores", "datatype": "FP32", "shape": [-1, -1]},
    {"name": "found", "datatype": "INT32", "shape": [-1]},
)
"""The v2 output tensors: ``ids`` and ``scores`` (queries x k; a rerank's ``scores`` 1 x documents) and
``found`` (each query's count of real entries: its row's first ``found`` are its answer)."""
_INTEGER = ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")


class BadRequest(ValueError):
    """A request the predictor refuses: one line, HTTP 400; the server goes on serving."""


@dataclass(frozen=True)
class Search:
    """The top ``k`` documents of the corpus for each query."""

    queries: list[str]
    k: int


@dataclass(frozen=True)
class Rerank:
    """MaxSim of ``query`` against each of ``documents``, in their order."""

    query: str
    documents: list[str]


def _shown(value) -> str:
    """A value as the client wrote it in JSON (``null``, ``"10"``, ``2.5``), cut to 40 characters."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def not_json(detail: str) -> str:
    """The one wording of a body that does not parse, for v1 and v2 alike."""
    first = detail.splitlines()[0][:200] if detail else "decode error"
    return f"the body is not valid JSON ({first}); send one JSON object"


def _text(value, where: str) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{where} must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:  # JSON's "\ud800" escape: no character, and no tokenizer takes it
        raise BadRequest(
            f"{where} holds a lone UTF-16 surrogate at character {e.start}; send valid Unicode text"
        ) from None
    if not value.strip():
        raise BadRequest(f"{where} is empty; send the query text" if where.endswith("query") else f"{where} is empty")
    if len(value) > MAX_TEXT:
        raise BadRequest(f"{where} has {len(value)} characters; at most {MAX_TEXT} are read")
    return value


def _k(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{where} must be an integer from 1 to {MAX_K}, got {_shown(value)}")
    if not 1 <= value <= MAX_K:
        raise BadRequest(f"{where} must be from 1 to {MAX_K}, got {value}")
    return value


def _documents(value, where: str) -> list[str]:
    if not isinstance(value, list) or not value:
        raise BadRequest(f"{where} must be a non-empty list of texts")
    if len(value) > MAX_DOCUMENTS:
        raise BadRequest(f"{where} holds {len(value)} texts; send at most {MAX_DOCUMENTS} a request")
    return [_text(d, f"{where}[{i}]") for i, d in enumerate(value)]


def parse_v1(payload) -> Search | Rerank:
    """``{"instances": [{"query": ..., "k": 10}, ...]}`` (search) or ``{"instances": [{"query": ...,
    "documents": [...]}]}`` (rerank: one instance). Every search instance must ask for the same ``k``."""
    if not isinstance(payload, dict) or not isinstance(payload.get("instances"), list):
        raise BadRequest('the body must be a JSON object with "instances": a list of {"query": ..., "k": ...}')
    instances = payload["instances"]
    if not instances:
        raise BadRequest("instances is empty; send at least one query")
    if len(instances) > MAX_INSTANCES:
        raise BadRequest(f"instances holds {len(instances)} queries; send at most {MAX_INSTANCES} a request")
    for i, one in enumerate(instances):
        if not isinstance(one, dict):
            raise BadRequest(f'instances[{i}] must be an object {{"query": ...}}, got {type(one).__name__}')
        if unknown := sorted(set(one) - {"query", "k", "documents"}):
            raise BadRequest(f"instances[{i}] has the unknown field {unknown[0]!r}; use query, k, documents")
    if any("documents" in one for one in instances):
        if len(instances) != 1 or "k" in instances[0]:
            raise BadRequest("a rerank request is one instance with query and documents (and no k)")
        return Rerank(
            _text(instances[0].get("query"), "instances[0].query"),
            _documents(instances[0]["documents"], "instances[0].documents"),
        )
    ks = {_k(one.get("k", DEFAULT_K), f"instances[{i}].k") for i, one in enumerate(instances)}
    if len(ks) > 1:
        raise BadRequest(f"the instances ask for different k ({sorted(ks)}); send one k a request")
    return Search([_text(one.get("query"), f"instances[{i}].query") for i, one in enumerate(instances)], ks.pop())


def _flat(values, name: str) -> list:
    """A tensor's data as a flat list (JSON nests it by shape only sometimes), bytes read as UTF-8."""
    if hasattr(values, "tolist"):  # a numpy array: the binary extension's tensors
        values = values.tolist()
    out: list = []
    for v in values if isinstance(values, (list, tuple)) else [values]:
        if isinstance(v, (list, tuple)):
            out.extend(_flat(v, name))
        elif isinstance(v, bytes):
            try:
                out.append(v.decode("utf-8"))
            except UnicodeDecodeError:
                raise BadRequest(f'"{name}" holds bytes that are not UTF-8; send UTF-8 text') from None
        else:
            out.append(v)
    return out


def _tensors(tensors: list[dict]) -> dict[str, list]:
    """Each input tensor's flat data by name, once its name, datatype and shape are checked."""
    want = {t["name"]: t["datatype"] for t in V2_INPUTS}
    found: dict[str, list] = {}
    for tensor in tensors:
        name, datatype, shape = tensor.get("name"), tensor.get("datatype"), tensor.get("shape")
        if name not in want:
            raise BadRequest(f"unknown input tensor {_shown(name)}; send query, and k or documents")
        if name in found:
            raise BadRequest(f'the input tensor "{name}" is given twice; send each tensor once')
        if datatype != want[name] and not (name == "k" and datatype in _INTEGER):
            kind = "an integer (INT32)" if name == "k" else want[name]
            raise BadRequest(f'"{name}" must be {kind} tensor, got {_shown(datatype)}')
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise BadRequest(f'"{name}" has the shape {_shown(shape)}; a shape is a list of sizes like [2]')
        data = _flat(tensor.get("data"), name)
        if math.prod(shape) != len(data):
            raise BadRequest(f'"{name}" has the shape {shape} but {len(data)} values; send a shape that holds them')
        found[name] = data
    return found


def parse_v2(tensors: list[dict]) -> Search | Rerank:
    """The v2 request's input tensors (``name``, ``datatype``, ``shape``, ``data``): ``query`` (BYTES, one or
    more) and ``k`` (an integer, one value) for a search; ``query`` (one) and ``documents`` (BYTES) for a rerank.
    Each name once, the datatype :data:`V2_INPUTS` gives, and a shape that holds exactly its values."""
    inputs = _tensors(tensors)
    queries = inputs.get("query")
    if not queries:
        raise BadRequest('the input tensor "query" (BYTES) is missing or empty')
    if "documents" in inputs:
        if len(queries) != 1 or "k" in inputs:
            raise BadRequest('a rerank request is one "query" and a "documents" tensor (and no "k")')
        return Rerank(_text(queries[0], "query"), _documents(list(inputs["documents"]), "documents"))
    if len(queries) > MAX_INSTANCES:
        raise BadRequest(f'"query" holds {len(queries)} queries; send at most {MAX_INSTANCES} a request')
    k = inputs.get("k", [DEFAULT_K])
    if len(k) != 1:
        raise BadRequest(f'"k" must hold one value, got {len(k)}')
    return Search([_text(q, f"query[{i}]") for i, q in enumerate(queries)], _k(k[0], "k"))


def v1_answer(request: Search | Rerank, result) -> dict:
    """``{"predictions": [{"ids": [...], "scores": [...], "found": n}, ...]}`` for a search (one per query; ``found``
    may be under k: PLAID scores a bounded set of candidates), ``{"predictions": [{"scores": [...]}]}`` for a
    rerank."""
    if isinstance(request, Rerank):
        return {"predictions": [{"scores": result}]}
    return {"predictions": [{"ids": ids, "scores": scores, "found": len(ids)} for ids, scores in result]}


def v2_outputs(request: Search | Rerank, result) -> list[tuple[str, list[int], str, list]]:
    """(name, shape, datatype, flat data) of each output tensor (:data:`V2_OUTPUTS`). A search's ``ids`` and
    ``scores`` are (queries, k), each row its query's answer alone: its first ``found`` entries, then ``""``
    and ``0.0`` up to k where fewer were found. A rerank's ``scores`` are (1, documents).

    >>> v2_outputs(Search(["a", "b"], 2), [(["d1", "d2"], [2.0, 1.0]), (["d3"], [3.0])])[:2]
    [('ids', [2, 2], 'BYTES', ['d1', 'd2', 'd3', '']), ('scores', [2, 2], 'FP32', [2.0, 1.0, 3.0, 0.0])]
    """
    if isinstance(request, Rerank):
        return [("scores", [1, len(result)], "FP32", result)]
    k, rows = request.k, len(result)
    ids = [i for found, _ in result for i in [*found, *[""] * (k - len(found))]]
    scores = [float(s) for _, found in result for s in [*found, *[0.0] * (k - len(found))]]
    found = [len(found) for found, _ in result]
    return [("ids", [rows, k], "BYTES", ids), ("scores", [rows, k], "FP32", scores), ("found", [rows], "INT32", found)]
