"""The ``mine:`` section of the config: hard negatives mined before training, and the teacher that scores them.

Its own module because the mining settings are a third of the schema; ``trainer/config/schema.py`` holds the rest
and the cross-field rules between sections (a teacher needs the distillation loss). What each setting does
is ``trainer/mine.py``'s and ``trainer/teacher.py``'s; docs/mining.md says when to change
them, docs/results.md has the figures behind them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trainer.config.base import Location, Strict
from trainer.retrieval import RETRIEVERS

__all__ = ["MineConfig", "TeacherConfig"]


class TeacherConfig(Strict):
    """A model that scores each mined row's documents for distillation (``trainer/teacher.py``)."""

    name_or_path: Location = Field(
        ...,
        min_length=1,
        description="A local directory (or object-store prefix) holding a sentence-transformers CrossEncoder, "
        "a sentence-transformers bi-encoder (e.g. model.name_or_path itself) or a PyLate ColBERT model.",
    )
    batch_size: int = Field(32, ge=1, description="(query, document) pairs per forward pass.")
    max_length: int = Field(256, ge=8, le=8192, description="Cross-encoder tokens per (query, document) pair.")
    scale: float = Field(
        20.0,
        gt=0,
        le=1000,
        description="A bi-encoder teacher's cosine is multiplied by this before the loss's softmax (20: the "
        "inverse temperature of sentence-transformers' MultipleNegativesRankingLoss).",
    )


class MineConfig(Strict):
    """Hard negatives mined before training: retrieve the top-k of a corpus for every query, drop the
    positives and likely false negatives, sample ``negatives`` from a rank range (``trainer/mine.py``)."""

    corpus: Location | None = Field(
        None,
        description="The documents to mine from: a .jsonl with a `text` (and optional `title`) per line, or a "
        "BEIR directory (its corpus.jsonl). Default: every distinct positive of data.train.",
    )
    retriever: Literal[tuple(RETRIEVERS)] = Field(  # type: ignore[valid-type]
        "model",
        description="First round: "
        + "; ".join(f"{r.key}: {r.summary}" for r in RETRIEVERS.values())
        + " (trainer/retrieval/). Later rounds mine with the ColBERT trained in the round before (exact "
        "MaxSim), through PLAID if this is plaid.",
    )
    model: Location | None = Field(
        None,
        min_length=1,
        description="The model the first round retrieves with (a ColBERT for model or plaid, a sentence-"
        "transformers bi-encoder for dense or hybrid), when it is not "
        "model.name_or_path: a model trained before on the same data, or a stronger one. Training still starts "
        "from model.name_or_path. Default: model.name_or_path.",
    )
    nbits: int = Field(4, ge=1, le=8, description="PLAID residual compression bits (retriever: plaid).")
    top_k: int = Field(100, ge=1, le=1000, description="Documents retrieved per query.")
    rank_range: list[int] = Field(
        default_factory=lambda: [3, 30],
        min_length=2,
        max_length=2,
        description="Sample negatives from these ranks (1-based, inclusive) of the top_k, counted after the "
        "query's positives and the candidates above max_score_ratio are removed: the first few left are still "
        "often unlabelled positives.",
    )
    max_score_ratio: float = Field(
        0.95,
        gt=0,
        le=1,
        description="Skip a candidate scoring above this fraction of the positive's score (a likely false "
        "negative), as sentence-transformers' mine_hard_negatives does with its relative margin.",
    )
    margin: float | None = Field(
        None,
        ge=0,
        description="Also skip a candidate scoring above the positive's score minus this (an absolute margin, "
        "sentence-transformers' absolute_margin). Default: none.",
    )
    min_score: float | None = Field(
        None, description="Skip a candidate scoring below this (too easy to teach anything). Default: none."
    )
    sampling: Literal["random", "top"] = Field(
        "random",
        description="random: a seeded sample of the rank range; top: its first `negatives` (the hardest left, "
        "NV-Retriever's TopK-PercPos).",
    )
    positive_within: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="Drop a row whose positive the retriever ranks below this (consistency filtering, as in "
        "GTR and Promptagator): a pair the model cannot find among its top documents is often vague or "
        "mislabelled. Default: keep every row.",
    )
    negatives: int = Field(3, ge=1, le=64, description="Negatives per (query, positive) row.")
    fallback: Literal["random", "drop"] = Field(
        "random",
        description="A row left with too few candidates (its positive ranks low; BM25 shares no word with its "
        "query): random keeps it with negatives drawn at random from the corpus, as labelled data all the same; "
        "drop drops it (0.3's behaviour, a consistency filter), which has won only with one label per query, "
        "a random projection start and a short run (docs/mining.md measures both). Counted in mining.json "
        "either way.",
    )
    rows_per_query: int | None = Field(
        None,
        ge=1,
        description="Keep at most this many rows per distinct query (a seeded sample of its rows); every "
        "positive of data.train still counts as the query's positive, so none becomes a negative. For data "
        "with many positives per query (NFCorpus: 43 on average). Default: every row.",
    )
    rounds: int = Field(
        1,
        ge=1,
        le=10,
        description="Mine then train, N times: each round after the first mines with the model the round "
        "before trained, then trains model.name_or_path again on the new negatives.",
    )
    batch_size: int = Field(64, ge=1, description="Texts per forward pass while encoding.")
    teacher: TeacherConfig | None = Field(
        None,
        description="Score each row's positive and negatives with this model and write distillation rows "
        "(query, documents, scores); needs loss: {name: distillation}.",
    )
    query_chunk: int = Field(2048, ge=1, description="Queries per resumable part of the mined rows.")

    @model_validator(mode="after")
    def _check(self) -> MineConfig:
        low, high = self.rank_range
        if not 1 <= low <= high:
            raise ValueError(f"mine.rank_range must be [low, high] with 1 <= low <= high, got [{low}, {high}]")
        if high > self.top_k:
            raise ValueError(
                f"mine.rank_range ends at rank {high} but mine.top_k retrieves only {self.top_k} documents; "
                f"raise mine.top_k to at least {high} or lower the range"
            )
        if self.model is not None and not RETRIEVERS[self.retriever].needs_model:
            raise ValueError(
                f"mine.model {self.model} is set but mine.retriever is {self.retriever}, which uses no model; "
                "set mine.retriever: model (or plaid, dense, hybrid), or remove mine.model"
            )
        if self.positive_within is not None and self.positive_within > self.top_k:
            raise ValueError(
                f"mine.positive_within {self.positive_within} is beyond mine.top_k {self.top_k}: the retriever "
                f"ranks only that many; raise mine.top_k or lower mine.positive_within"
            )
        if high - low + 1 < self.negatives:
            raise ValueError(
                f"mine.rank_range [{low}, {high}] holds {high - low + 1} ranks, fewer than mine.negatives "
                f"({self.negatives}); widen the range or ask for fewer negatives"
            )
        return self
