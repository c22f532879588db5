"""Teacher scores for distillation: a cross-encoder, a bi-encoder or a ColBERT model scores each mined row.

PyLate's distillation loss needs, per query, scores of its documents from a stronger model; PyLate
never produces them. Here any sentence-transformers ``CrossEncoder`` (raw logits: the loss applies
its own softmax), sentence-transformers bi-encoder (cosine times ``scale``) or PyLate ColBERT model
(MaxSim) scores the rows, sharded over ranks in fixed blocks of ``BLOCK`` rows (block b goes to rank
b mod W) and gathered. Each block is scored alone, with the same forward passes on any world size, so the
scores are the same bits on 1 rank or 64. A bi-encoder scores no pair together, so it encodes each distinct
text once instead, in fixed blocks of ``BLOCK`` texts dealt the same way, and takes dot products.

A cross-encoder must give one logit per pair: transformers' default head has two, NLI models three, and
flattening those would hand every row its neighbours' logits. Any other count is refused in one line.

What a directory holds decides the kind (``trainer/model_kind.py``); a directory of no kind is refused with
one line.

Why a bi-encoder teacher: a ColBERT built on a sentence-transformers model starts with a random
projection and, on NFCorpus, stays below the bi-encoder it was built from for its first hundred-odd steps.
The base model as a bi-encoder is then the stronger model at hand, and its scores grade every candidate,
also the unlabelled positives that sparse labels leave among the negatives. Its cosine lies in [-1, 1]; a
softmax over that is nearly flat, so it is multiplied by ``scale`` (20: the inverse temperature
sentence-transformers' MultipleNegativesRankingLoss trains such models with).
"""

from __future__ import annotations

from pathlib import Path

import torch

from trainer import distributed as D
from trainer.config.mine import TeacherConfig
from trainer.config.schema import ModelConfig
from trainer.data import DataError
from trainer.encode import embed_texts
from trainer.errors import JobVerdict
from trainer.model_kind import Kind, model_config, model_kind

__all__ = ["BLOCK", "Teacher", "TeacherError", "teacher_kind"]

BLOCK = 64  # rows scored together: the unit dealt to the ranks, so batches never depend on the world size
PAIRS = 65_536  # a bi-encoder's (query, document) dot products at once: 100 MB at 384 dimensions


class TeacherError(DataError, JobVerdict):
    """The teacher is missing or of a kind that cannot score (query, document) pairs: one line, exit 2."""


def teacher_kind(path: str) -> Kind:
    """``colbert``, ``cross-encoder`` (one logit per pair) or ``bi-encoder``, read from the model directory's
    files (:func:`trainer.model_kind.model_kind`); anything else is refused in one line."""
    from trainer.model import resolve_model_path

    if not Path(resolve_model_path(path)).is_dir():
        raise TeacherError(f"mine.teacher.name_or_path {path} is not a local model directory")
    kind = model_kind(path)
    if kind == "cross-encoder":
        _one_logit(path, _labels(model_config(path)))
    if kind is not None:
        return kind
    found = ", ".join(map(str, model_config(path).get("architectures") or [])) or "no architectures in config.json"
    raise TeacherError(
        f"mine.teacher.name_or_path {path} is neither a cross-encoder (a *ForSequenceClassification model, "
        f"found: {found}), a sentence-transformers bi-encoder (modules.json with a Pooling module) nor a PyLate "
        "ColBERT model; give one of those"
    )


def _labels(config: dict) -> int:
    """The logits per pair a transformers config gives (its default head has two)."""
    return len(config.get("id2label") or {}) or int(config.get("num_labels", 2))


def _one_logit(path: str, labels: int) -> None:
    if labels != 1:
        raise TeacherError(
            f"mine.teacher.name_or_path {path} gives {labels} logits per pair (num_labels {labels}: a classifier, "
            "e.g. NLI); distillation needs one relevance score per pair: give a reranker with num_labels 1"
        )


class Teacher:
    """Scores (query, documents) rows with a cross-encoder's logits, a bi-encoder's scaled cosine or a
    ColBERT model's MaxSim."""

    def __init__(self, cfg: TeacherConfig, model_cfg: ModelConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        self.kind = teacher_kind(cfg.name_or_path)
        if self.kind == "cross-encoder":
            from sentence_transformers import CrossEncoder

            self.model = CrossEncoder(cfg.name_or_path, device=str(device), max_length=cfg.max_length)
            _one_logit(cfg.name_or_path, self.model.model.config.num_labels)  # what was loaded, not just the file
        elif self.kind == "bi-encoder":
            from trainer.retrieval.dense import load_bi_encoder

            self.model = load_bi_encoder(cfg.name_or_path, device)
        else:
            from trainer.model import build_model

            self.model = build_model(model_cfg.model_copy(update={"name_or_path": cfg.name_or_path}), device)
        self.model.eval()

    def score(self, queries: list[str], documents: list[list[str]]) -> list[list[float]]:
        """Every rank passes the same rows; each scores its share, and all get every row's scores."""
        if self.kind == "bi-encoder":  # no pair is scored together: each text is encoded once, then dot products
            return self._cosines(queries, documents)
        rank, world = D.rank(), D.world_size()
        blocks = list(range(0, len(queries), BLOCK))[rank::world]
        local = [self._score(queries[b : b + BLOCK], documents[b : b + BLOCK]) for b in blocks]
        out: list[list[float]] = [[] for _ in queries]
        for part in D.gather_objects(list(zip(blocks, local))):
            for b, scores in part:
                out[b : b + len(scores)] = scores
        return out

    @torch.no_grad()
    def _score(self, queries: list[str], documents: list[list[str]]) -> list[list[float]]:
        if not queries:
            return []
        if self.kind == "cross-encoder":
            pairs = [(q, d) for q, docs in zip(queries, documents) for d in docs]
            flat = self.model.predict(
                pairs,
                batch_size=self.cfg.batch_size,
                activation_fn=torch.nn.Identity(),  # logits: the distillation loss takes its own softmax
                convert_to_tensor=True,
                show_progress_bar=False,
            )
            if flat.dim() > 1 and flat.shape[-1] != 1 or flat.numel() != len(pairs):
                raise TeacherError(
                    f"mine.teacher.name_or_path {self.cfg.name_or_path} gave {flat.numel()} scores for {len(pairs)} "
                    "pairs; give a reranker with one logit per pair (num_labels 1)"
                )
            flat = flat.float().reshape(-1).tolist()
        else:
            from pylate.scores import colbert_scores

            from trainer.retrieval.exact import own_columns

            m, bs = self.model, self.cfg.batch_size
            q_emb, _ = embed_texts(m, queries, True, bs, m.query_length, self.device)
            d_emb, d_mask = embed_texts(
                m, [d for docs in documents for d in docs], False, bs, m.document_length, self.device
            )
            d_emb = own_columns(d_emb, d_mask)  # each document's own MaxSim, whatever is padded beside it
            flat, at = [], 0
            for i, docs in enumerate(documents):
                rows = slice(at, at + len(docs))
                flat += colbert_scores(q_emb[i : i + 1], d_emb[rows])[0].tolist()
                at += len(docs)
        out, at = [], 0
        for docs in documents:
            out.append(flat[at : at + len(docs)])
            at += len(docs)
        return out

    def _cosines(self, queries: list[str], documents: list[list[str]]) -> list[list[float]]:
        """Each (query, document) pair's cosine times ``scale``, row by row in the rows' own order.

        A document sits in many rows (a positive of several queries, a negative of dozens): each distinct
        text is encoded once, not once per row (NFCorpus with all labels: 3.6k documents, not 37k encodings)."""
        q_texts, d_texts = sorted(set(queries)), sorted({d for docs in documents for d in docs})
        q, d = self._encode_shared(q_texts), self._encode_shared(d_texts)  # every rank calls both: no hang
        if not queries:
            return []
        q_at, d_at = {t: i for i, t in enumerate(q_texts)}, {t: i for i, t in enumerate(d_texts)}
        lengths = torch.tensor([len(docs) for docs in documents], dtype=torch.long)
        rows = torch.repeat_interleave(torch.tensor([q_at[t] for t in queries], dtype=torch.long), lengths)
        cols = torch.tensor([d_at[t] for docs in documents for t in docs], dtype=torch.long)
        flat: list[float] = []
        for at in range(0, len(cols), PAIRS):  # (pairs x dim) at a time, not for the whole part at once
            pick = slice(at, at + PAIRS)
            flat += ((q[rows[pick]] * d[cols[pick]]).sum(-1).float() * self.cfg.scale).tolist()
        return [flat[a - n : a] for a, n in zip(torch.cumsum(lengths, 0).tolist(), lengths.tolist())]

    def _encode_shared(self, texts: list[str]) -> torch.Tensor:
        """Normalised embeddings of ``texts`` (sorted, distinct): fixed blocks of ``BLOCK`` texts, block b on rank
        b mod W, each encoded alone (the same bits on any world size), gathered on every rank."""
        rank, world = D.rank(), D.world_size()
        encode = dict(batch_size=self.cfg.batch_size, convert_to_tensor=True, normalize_embeddings=True)
        blocks = list(range(0, len(texts), BLOCK))[rank::world]
        local = [(b, self.model.encode(texts[b : b + BLOCK], **encode).cpu()) for b in blocks]
        parts = sorted((pair for part in D.gather_objects(local) for pair in part), key=lambda pair: pair[0])
        return torch.cat([e for _, e in parts]) if parts else torch.empty(0, 0)
