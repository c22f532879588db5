"""The model behind the predictor, without KServe: load an export, search its corpus, rerank texts.

:func:`locate` finds the model and its index in what ``serve`` is given: an export (``s3://``, ``gs://``,
``az://``: staged into a cache and checked against its manifest, as ``model.name_or_path: s3://...`` is; or a
local copy of one, checked the same way) or a job's ``output_dir`` (``final-model/`` and ``index/``, checked
against their own manifests). :class:`Engine` answers

* **search** through the PLAID index the job built, held in memory (``trainer/serve/plaid.py``: the search
  ``trainer/index.py`` measured it with), or, with ``exact``, by exact MaxSim over the corpus embeddings stored
  beside it (``trainer/serve/corpus.py``), scored in the evaluation's chunks;
* **rerank**: one query's MaxSim (PyLate's ``colbert_scores``) against each text, over its own tokens.

Queries and reranked texts are encoded by the PyTorch model (with ``precision="bf16"``, under torch's bfloat16
autocast: about half the time on a CPU with native bfloat16, embeddings returned in float32), or, with ``onnx``
(``fp32`` or ``int8``), by its ONNX export beside it (``onnx/``, ``trainer/onnx_export.py``) in ONNX Runtime:
checked against its manifest, and int8 refused where its parity says it lost more nDCG@10 than allowed, unless
``allow_int8_loss``. The search itself (PLAID, or the exact MaxSim) is the same in every case.

:meth:`Engine.answer` answers a batch of concurrent requests (``trainer/serve/batcher.py``) with one encode and
one search, and gives each request what it would get alone. It is two stages, :meth:`Engine.encode_batch` then
:meth:`Engine.search_batch` (:attr:`Engine.stages`), which the predictor's batcher runs on consecutive batches at
once: one batch's queries are encoded while the batch before is searched.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.query_length import token_counts
from trainer.retrieval.exact import ModelRetriever, maxsim, own_columns
from trainer.retrieval.plaid import x86_without
from trainer.serve import ServeError
from trainer.serve.corpus import EMBEDDINGS, load_corpus
from trainer.serve.options import PRECISIONS
from trainer.serve.plaid import PlaidIndex
from trainer.serve.requests import BadRequest, Rerank, Search

__all__ = [
    "CutQueries",
    "Engine",
    "ServeError",
    "autocast_bf16",
    "bf16_is_native",
    "locate",
    "onnx_encoder",
    "texts_of",
]

log = logging.getLogger("trainer.serve")

# Texts encoded at a time, on a CPU and on a GPU. PyLate sorts a call's texts by length and pads each batch to
# its longest: a 20-document rerank of docstrings (27 to 370 tokens) took 1.1 s on one CPU thread encoded 8 at a
# time against 1.7-1.9 s at 32 (and 1.5 s one at a time), since a CPU's matrix products are already efficient at
# 8 x 180 tokens and padding is waste. A GPU wants wide batches.
ENCODE_BATCH_CPU, ENCODE_BATCH_GPU = 8, 32


def bf16_is_native(device: str, flags: str | None = None, machine: str | None = None) -> bool:
    """Whether ``device`` computes bfloat16 natively: a CUDA GPU that supports it, or a CPU but an x86 one without
    AVX512-BF16 or AMX-BF16 (there torch emulates it, slower than float32). ``flags``: /proc/cpuinfo's.

    >>> bf16_is_native("cpu", "avx2 avx512f avx512_bf16", "x86_64"), bf16_is_native("cpu", "avx2 fma", "x86_64")
    (True, False)
    """
    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return not x86_without({"avx512_bf16", "amx_bf16"}, flags, machine)


def autocast_bf16(forward, device_type: str):
    """The model's ``forward`` under torch's bfloat16 autocast (matrix products in bfloat16, normalisations in
    float32), its floating outputs returned in float32: every encode goes through it (PyLate's ``encode`` and the
    exact search's ``embed_texts`` alike), and everything after it (the search, the MaxSim) is float32. The one
    wrapper of the bf16 encoder: ``bench/encoder_precision.py`` measures what it costs in quality with it."""

    @functools.wraps(forward)
    def forward_bf16(*args, **kwargs):
        with torch.autocast(device_type, dtype=torch.bfloat16):
            out = forward(*args, **kwargs)
        return {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in out.items()}

    return forward_bf16


def texts_of(request: Search | Rerank) -> int:
    """What a request costs a batch: the texts it encodes (its queries; a rerank's query and documents)."""
    return len(request.queries) if isinstance(request, Search) else 1 + len(request.documents)


@dataclass
class _Encoded:
    """A search between the stages: its request, and its queries' embeddings (PyLate's encode, one ``(q_tokens,
    dim)`` a query, for PLAID; the evaluation's, ``(queries, query_length, dim)``, for exact MaxSim)."""

    request: Search
    queries: Any


def _raised(answer):
    """``answer``, or raised where it is a refusal."""
    if isinstance(answer, BaseException):
        raise answer
    return answer


class _StoredCorpus(ModelRetriever):
    """The evaluation's exact retriever (``trainer/retrieval/exact.py``) over the chunks stored with the index,
    float32 as the evaluation encodes them: its query encoding, its scoring, its top-k."""

    def __init__(self, model, chunks: list[tuple], batch_size: int, device):
        super().__init__(model, [], batch_size, device, show=False, stored=False)
        self.chunks, self.stored = [(first, own_columns(emb, mask), mask) for first, emb, mask in chunks], True


def _check_export(root: Path) -> None:
    """A local copy of an export: every file its manifest lists, with that size and sha256."""
    from trainer.atomic import sha256_of
    from trainer.storage.export import MANIFEST, PARTIAL

    if (root / PARTIAL).exists():
        raise ServeError(f"{root}: an export was being written there ({PARTIAL}); export it again")
    try:
        listed = json.loads((root / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ServeError(f"{root / MANIFEST} cannot be read ({type(e).__name__}); export it again") from None
    for name, want in listed.items():
        path = root / name
        if not path.is_file() or path.stat().st_size != want["size"] or sha256_of(path) != want["sha256"]:
            raise ServeError(f"{root}: {name} is missing or does not match the export's manifest; export it again")


def _check_whole(directory: Path, what: str) -> None:
    from trainer.run.checkpoint import verify

    if problem := verify(directory, required=True):
        raise ServeError(f"{what} {directory} is not whole ({problem}); let the job finish, or export it again")


def locate(uri: str, cache_dir: str | Path) -> tuple[Path, Path | None]:
    """(model directory, index directory or None) of an export or a job's output_dir, checked whole."""
    from trainer.storage.export import MANIFEST
    from trainer.storage.sources import is_remote, stage

    if uri.startswith("hf://"):
        raise ServeError(f"{uri}: serve reads an export on s3://, gs://, az:// or a local path, not the Hub")
    if is_remote(uri):
        root = stage(uri if uri.endswith("/") else uri + "/", cache_dir)  # checked against its manifest
    else:
        root = Path(uri)
        if not root.is_dir():
            raise ServeError(f"{uri} is not a directory; give an export (s3://BUCKET/PREFIX/) or a job's output_dir")
        if (root / MANIFEST).is_file():
            _check_export(root)
    if (root / "final-model").is_dir():  # a job's output_dir
        _check_whole(root / "final-model", "the final model")
        model = root / "final-model"
    elif (root / "config_sentence_transformers.json").is_file():
        model = root
    else:
        raise ServeError(f"{uri} holds no ColBERT model (no final-model/ and no config_sentence_transformers.json)")
    index = root / "index"
    if not index.is_dir():
        return model, None
    _check_whole(index, "the index")
    return model, index


def onnx_encoder(model_dir: Path, form: str, allow_int8_loss: bool = False):
    """The ONNX export of ``form`` beside the model, checked whole, and int8 only where its parity allows it."""
    from trainer.onnx_export import FORMS, ONNX_DIR, PARITY, OnnxEncoder

    folder = model_dir / ONNX_DIR
    if not (folder / FORMS[form]).is_file():
        raise ServeError(
            f"{model_dir} has no ONNX export ({ONNX_DIR}/{FORMS[form]}); write it with `colbert-k8s export-onnx "
            f"{model_dir}` (or the job's onnx: section), or serve without --onnx"
        )
    _check_whole(folder, "the ONNX export")
    parity = json.loads((folder / PARITY).read_text())
    if form == "int8" and not parity["int8_ok"] and not allow_int8_loss:
        loss = (
            f"loses {parity['int8_loss']:.4f} nDCG@10 against PyTorch, more than the {parity['max_int8_loss']} allowed"
            if "int8_loss" in parity
            else "was not measured on a held-out split"
        )
        raise ServeError(
            f"the int8 ONNX encoder {loss} ({folder / PARITY}); serve --onnx fp32, or --onnx int8 --allow-int8-loss"
        )
    return OnnxEncoder(folder, form, threads=torch.get_num_threads())  # OMP_NUM_THREADS, as torch's


class CutQueries:
    """Counts the queries longer than the model's ``query_length``, which its encoder cuts: ColBERT reads a fixed
    number of query tokens (the [Q] marker included), and a model trained with ``model.query_length: auto`` on short
    queries is saved with a short one. The first cut query is logged, then a count at most once a minute, so that
    longer production queries than the training queries are never read in part unsaid.

    >>> watch = CutQueries(query_length=4, count=lambda texts: [len(t.split()) + 1 for t in texts], every_s=0)
    >>> watch(["short", "a query of six words here"])  # 2 and 7 tokens with the [Q] marker
    1
    >>> watch.cut, watch.seen
    (1, 2)
    """

    def __init__(self, query_length: int, count, every_s: float = 60.0):
        self.query_length, self.count, self.every_s = query_length, count, every_s
        self.cut = self.seen = 0
        self._logged = -float("inf")
        self._lock = threading.Lock()  # the batcher's stages and a direct call may count at once

    def __call__(self, queries: list[str]) -> int:
        """How many of ``queries`` the encoder cuts; logs as the class says."""
        lengths = self.count(queries)
        longest = max(lengths, default=0)
        cut = sum(n > self.query_length for n in lengths)
        with self._lock:
            first = cut and not self.cut
            self.cut, self.seen = self.cut + cut, self.seen + len(queries)
            due = cut and time.monotonic() - self._logged >= self.every_s
            if due:
                self._logged = time.monotonic()
                cut_so_far, seen = self.cut, self.seen
        if first:
            log.warning(
                "a query of %d tokens was cut to the model's %d (its query_length, the [Q] marker included): "
                "the model reads only the start of queries longer than it was trained for; retrain with a larger "
                "model.query_length if your users' queries are longer than your training queries",
                longest,
                self.query_length,
            )
        elif due:
            log.warning(
                "%s of %s queries so far were cut to %d tokens", f"{cut_so_far:,}", f"{seen:,}", self.query_length
            )
        return cut


class Engine:
    """A PyLate ColBERT model and the corpus it searches (PLAID, or exact MaxSim over stored embeddings)."""

    def __init__(
        self,
        model_dir: Path,
        index_dir: Path | None,
        exact: bool,
        device: str,
        batch_size: int | None = None,
        onnx: str | None = None,
        allow_int8_loss: bool = False,
        precision: str = "fp32",
    ):
        from pylate import models

        if precision not in PRECISIONS:
            raise ServeError(f"precision must be {' or '.join(PRECISIONS)}, got {precision!r}")
        if precision != "fp32" and onnx:
            raise ServeError(f"precision {precision} is the PyTorch encoder's; the ONNX encoder ({onnx}) has its own")
        self.device, self.exact, self.onnx, self.precision = torch.device(device), exact, onnx, precision
        self.batch_size = batch_size or (ENCODE_BATCH_CPU if self.device.type == "cpu" else ENCODE_BATCH_GPU)
        if onnx:  # ONNX Runtime on the CPU; the search itself stays where ``device`` says
            self.model = onnx_encoder(model_dir, onnx, allow_int8_loss)
        else:
            self.model = models.ColBERT(str(model_dir), device=device)
        self.model.eval()
        self.cut_queries = CutQueries(self.model.query_length, functools.partial(token_counts, self.model.tokenizer))
        if precision == "bf16":
            if not bf16_is_native(str(self.device)):
                log.warning("this %s has no native bfloat16: bf16 encodes are emulated, slower than float32", device)
            self.model.forward = autocast_bf16(self.model.forward, self.device.type)
        self.index = self.corpus = None
        self.documents = 0
        if exact:
            if index_dir is None or not (index_dir / EMBEDDINGS).is_file():
                raise ServeError(
                    f"--exact needs the corpus embeddings beside the index ({EMBEDDINGS}); train with index: "
                    "{embeddings: true} and export.include: [index], or serve without --exact (the PLAID index)"
                )
            self.ids, chunks = load_corpus(index_dir, self.device)
            self.corpus = _StoredCorpus(self.model, chunks, self.batch_size, self.device)
            self.documents = len(self.ids)
        elif index_dir is not None:
            self.index = PlaidIndex(index_dir, device, threads=torch.get_num_threads())
            self.documents = len(self.index.ids)
        log.info("serving %s: %s", model_dir, self.describe())

    def describe(self) -> str:
        """One line: what the engine searches with, for the log and ``serve``'s start-up line."""
        how = "exact MaxSim" if self.exact else "the PLAID index" if self.index is not None else None
        what = f"search of {self.documents} documents by {how}, and rerank" if how else "rerank only (no index)"
        encoder = f"ONNX {self.onnx}" if self.onnx else "bfloat16 autocast" if self.precision == "bf16" else None
        return (
            what
            + f"; queries read up to {self.model.query_length} tokens"
            + (f"; encoder: {encoder}" if encoder else "")
        )

    @property
    def stages(self) -> tuple:
        """The batcher's stages (``trainer/serve/batcher.py``): :meth:`encode_batch`, then :meth:`search_batch`,
        so that one batch is encoded while the one before is searched."""
        return (self.encode_batch, self.search_batch)

    def answer(self, requests: list[Search | Rerank]) -> list:
        """Each request's answer, or the :class:`BadRequest` that refuses it: the two stages, one after the other."""
        return self.search_batch(self.encode_batch(requests))

    @torch.no_grad()
    def encode_batch(self, requests: list[Search | Rerank]) -> list:
        """The first stage: each search's queries encoded, for :meth:`search_batch`; each rerank answered whole;
        each refused request its :class:`BadRequest`. The searches' queries are one encode, the reranks' queries
        one and their documents one. A rerank is all encoding (its MaxSim is cheap), so it is done here, and the
        second stage is the search alone."""
        done: list = [None] * len(requests)
        for kind, encode_all in ((Search, self._encode_searches), (Rerank, self._reranks)):
            group = [i for i, r in enumerate(requests) if isinstance(r, kind)]
            if not group:
                continue
            try:
                for i, one in zip(group, encode_all([requests[i] for i in group])):
                    done[i] = one
            except BadRequest as e:
                for i in group:
                    done[i] = e
        return done

    @torch.no_grad()
    def search_batch(self, encoded: list) -> list:
        """The second stage: the searches :meth:`encode_batch` encoded, searched together (the PLAID index, or
        exact MaxSim); what else it gave (a rerank's scores, a refusal) is passed on as it is."""
        answers = list(encoded)
        searches = [i for i, e in enumerate(encoded) if isinstance(e, _Encoded)]
        for i, found in zip(searches, self._search_encoded([encoded[i] for i in searches])):
            answers[i] = found
        return answers

    def search(self, queries: list[str], k: int) -> list[tuple[list[str], list[float]]]:
        """Per query, the ids and scores of its top ``k`` documents (fewer when the corpus holds fewer)."""
        return _raised(self.answer([Search(queries, k)])[0])

    def rerank(self, query: str, documents: list[str]) -> list[float]:
        """MaxSim of ``query`` against each document."""
        return _raised(self.answer([Rerank(query, documents)])[0])

    def _encode_searches(self, requests: list[Search]) -> list[_Encoded]:
        if self.corpus is None and self.index is None:
            raise BadRequest(
                "this model was exported without an index, so it cannot search; rerank works "
                "(export.include: [index] exports one)"
            )
        queries = [q for r in requests for q in r.queries]
        self.cut_queries(queries)
        if self.index is not None:  # as trainer/index.py searches: PyLate's encode, then the PLAID search
            q = self.model.encode(queries, is_query=True, batch_size=self.batch_size, show_progress_bar=False)
        else:  # the evaluation's encode: (queries, query_length, dim)
            q = self.corpus.embed_queries(queries)
        encoded, at = [], 0
        for r in requests:
            encoded.append(_Encoded(r, q[at : at + len(r.queries)]))
            at += len(r.queries)
        return encoded

    def _search_encoded(self, encoded: list[_Encoded]) -> list[list[tuple[list[str], list[float]]]]:
        ks = [min(e.request.k, self.documents) for e in encoded for _ in e.request.queries]
        if not ks:
            return [[] for _ in encoded]
        if self.index is not None:
            q = [one for e in encoded for one in e.queries]  # each (q_tokens, dim)
            found: list = [None] * len(q)
            for k in sorted(set(ks)):  # one search a k: fast-plaid's candidates are not promised to be k-free
                at = [i for i, ki in enumerate(ks) if ki == k]
                for i, hits in zip(at, self.index.search([q[i] for i in at], k)):
                    found[i] = ([d for d, _ in hits], [s for _, s in hits])
        else:  # the top of the largest k, cut: a stable sort puts each query's own top k first, in that order
            q = torch.cat([e.queries for e in encoded])  # (queries, query_length, dim)
            found = [(ids[:k], scores[:k]) for (ids, scores), k in zip(self._exact(q, max(ks)), ks)]
        answers, at = [], 0
        for e in encoded:
            answers.append(found[at : at + len(e.request.queries)])
            at += len(e.request.queries)
        return answers

    def _exact(self, q: torch.Tensor, k: int) -> list[tuple[list[str], list[float]]]:
        """The evaluation's search (``trainer/evaluate.py``): the same retriever over the same chunks."""
        found, _ = self.corpus.search_embedded(q, [set() for _ in range(len(q))], k)
        return [([self.ids[d] for d, _ in top], [s for _, s in top]) for top in found]

    def _reranks(self, requests: list[Rerank]) -> list[list[float]]:
        """One encode of every request's query and one of every request's candidates (PyLate sorts them by
        length, so short texts are not padded to long ones); each request's MaxSim is PyLate's
        ``colbert_scores``, as the evaluation's, over each candidate's own tokens."""
        encode = dict(batch_size=self.batch_size, show_progress_bar=False)
        texts = [r.query for r in requests]
        self.cut_queries(texts)
        queries = self.model.encode(texts, is_query=True, **encode)  # each (q_tokens, dim)
        candidates = self.model.encode([d for r in requests for d in r.documents], is_query=False, **encode)
        answers, at = [], 0
        for request, query in zip(requests, queries):
            mine = [torch.as_tensor(d) for d in candidates[at : at + len(request.documents)]]  # each (tokens, dim)
            at += len(request.documents)
            answers.append(maxsim(torch.as_tensor(query)[None], mine)[0].tolist())
        return answers
