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
"""

from __future__ import annotations

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


def _text(value, where: str) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{where} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise BadRequest(f"{where} is empty; send the query text" if where.endswith("query") else f"{where} is empty")
    if len(value) > MAX_TEXT:
        raise BadRequest(f"{where} has {len(value)} characters; at most {MAX_TEXT} are read")
    return value


def _k(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{where} must be an integer from 1 to {MAX_K}, got {str(value)[:40]!r}")
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


def parse_v2(inputs: dict[str, list]) -> Search | Rerank:
    """The v2 request's tensors by name, flattened: ``query`` (BYTES, one or more), ``k`` (INT, one value) for a
    search; ``query`` (one) and ``documents`` (BYTES) for a rerank."""
    if unknown := sorted(set(inputs) - {"query", "k", "documents"}):
        raise BadRequest(f"unknown input tensor {unknown[0]!r}; send query, and k or documents")
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
    """``{"predictions": [{"ids": [...], "scores": [...]}, ...]}`` for a search (one per query), ``{"predictions":
    [{"scores": [...]}]}`` for a rerank."""
    if isinstance(request, Rerank):
        return {"predictions": [{"scores": result}]}
    return {"predictions": [{"ids": ids, "scores": scores} for ids, scores in result]}


def v2_outputs(request: Search | Rerank, result) -> list[tuple[str, list[int], str, list]]:
    """(name, shape, datatype, flat data) of each output tensor: ``ids`` (BYTES) and ``scores`` (FP32), shaped
    (queries, k) for a search, ``scores`` (documents,) for a rerank. A search's k is the least any query found
    (the corpus may hold fewer documents than asked for)."""
    if isinstance(request, Rerank):
        return [("scores", [len(result)], "FP32", result)]
    k = min(len(ids) for ids, _ in result)
    ids = [i for found, _ in result for i in found[:k]]
    scores = [s for _, found in result for s in found[:k]]
    return [("ids", [len(result), k], "BYTES", ids), ("scores", [len(result), k], "FP32", scores)]
