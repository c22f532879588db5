"""Teacher scores for distillation: a cross-encoder or a ColBERT model scores each mined row's documents.

PyLate's distillation loss needs, per query, scores of its documents from a stronger model; PyLate
never produces them. Here any sentence-transformers ``CrossEncoder`` (raw logits: the loss applies
its own softmax) or PyLate ColBERT model (MaxSim) scores the rows, sharded over ranks: rank r scores
rows r, r + W, ... and the scores are gathered, so the result does not depend on the world size.

What a directory holds decides the kind: a PyLate module in ``modules.json`` is ColBERT; a
``*ForSequenceClassification`` architecture in ``config.json`` is a cross-encoder; anything else is
refused with one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from trainer import distributed as D
from trainer.config import ModelConfig, TeacherConfig
from trainer.data import DataError
from trainer.encode import embed_texts
from trainer.errors import JobVerdict

__all__ = ["Teacher", "TeacherError", "teacher_kind"]


class TeacherError(DataError, JobVerdict):
    """The teacher is missing or of a kind that cannot score (query, document) pairs: one line, exit 2."""


def teacher_kind(path: str) -> str:
    """``colbert`` or ``cross-encoder``, read from the model directory's files."""
    root = Path(path)
    if not root.is_dir():
        raise TeacherError(f"mine.teacher.name_or_path {path} is not a local model directory")
    modules = root / "modules.json"
    if modules.is_file() and "pylate" in modules.read_text():
        return "colbert"
    config = root / "config.json"
    architectures = json.loads(config.read_text()).get("architectures") or [] if config.is_file() else []
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        return "cross-encoder"
    found = ", ".join(architectures) or "no architectures in config.json"
    raise TeacherError(
        f"mine.teacher.name_or_path {path} is neither a cross-encoder (a *ForSequenceClassification model, "
        f"found: {found}) nor a PyLate ColBERT model; give a sentence-transformers CrossEncoder or a ColBERT model"
    )


class Teacher:
    """Scores (query, documents) rows with a cross-encoder's logits or a ColBERT model's MaxSim."""

    def __init__(self, cfg: TeacherConfig, model_cfg: ModelConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        self.kind = teacher_kind(cfg.name_or_path)
        if self.kind == "cross-encoder":
            from sentence_transformers import CrossEncoder

            self.model = CrossEncoder(cfg.name_or_path, device=str(device), max_length=cfg.max_length)
        else:
            from trainer.model import build_model

            self.model = build_model(model_cfg.model_copy(update={"name_or_path": cfg.name_or_path}), device)
        self.model.eval()

    def score(self, queries: list[str], documents: list[list[str]]) -> list[list[float]]:
        """Every rank passes the same rows; each scores its share, and all get every row's scores."""
        rank, world = D.rank(), D.world_size()
        mine = list(range(rank, len(queries), world))
        local = self._score([queries[i] for i in mine], [documents[i] for i in mine])
        out: list[list[float]] = [[] for _ in queries]
        for part in D.gather_objects(list(zip(mine, local))):
            for i, scores in part:
                out[i] = scores
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
            flat = flat.float().reshape(-1).tolist()
        else:
            from pylate.scores import colbert_scores

            m, bs = self.model, self.cfg.batch_size
            q_emb, _ = embed_texts(m, queries, True, bs, m.query_length, self.device)
            d_emb, d_mask = embed_texts(
                m, [d for docs in documents for d in docs], False, bs, m.document_length, self.device
            )
            flat, at = [], 0
            for i, docs in enumerate(documents):
                rows = slice(at, at + len(docs))
                flat += colbert_scores(q_emb[i : i + 1], d_emb[rows], documents_mask=d_mask[rows].float())[0].tolist()
                at += len(docs)
        out, at = [], 0
        for docs in documents:
            out.append(flat[at : at + len(docs)])
            at += len(docs)
        return out
