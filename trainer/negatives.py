"""Choosing a row's negatives from its retrieved candidates, and what happens to a row that has too few.

A pure function of the candidates, the row's positives, the ``mine:`` settings and a per-row seed: the same
negatives whatever the world size. Mining (``trainer/mine.py``) calls it for every (query, positive) row.

A row left with too few candidates (its positive ranks low, BM25 shares no word with its query) is kept by
default with negatives drawn at random from the corpus (``mine.fallback: random``): its (query, positive) pair
is labelled data all the same, and in-batch negatives still teach from it. ``mine.fallback: drop`` drops it,
as 0.3 did (docs/results.md measures both).
"""

from __future__ import annotations

import logging
import random
from enum import Enum

from trainer.config.mine import MineConfig
from trainer.retrieval.search import Candidates

__all__ = ["FALLS_BACK", "Dropped", "choose_negatives", "explain_drops", "random_negatives", "row_negatives"]

log = logging.getLogger("trainer")


class Dropped(str, Enum):
    """Why a row got no negatives; mining.json and the log count each reason."""

    TOO_FEW = "too_few"  # fewer than mine.negatives candidates left in rank_range within the top_k
    POSITIVE_WITHIN = "positive_within"  # the retriever ranks the positive below mine.positive_within
    NO_TERMS = "no_terms"  # BM25 keeps no word of the query (stopwords, punctuation, one-letter words)
    ROWS_PER_QUERY = "rows_per_query"  # past mine.rows_per_query rows of one query (their positives still count)
    UNMATCHED = "unmatched"  # too few left because BM25 scored too few documents above 0 for the query


# the reasons ``mine.fallback: random`` keeps a row for: the retriever found too little, not a setting's choice
FALLS_BACK = frozenset({Dropped.TOO_FEW, Dropped.NO_TERMS, Dropped.UNMATCHED})


def choose_negatives(
    candidates: Candidates, positives: set[int], positive_score: float, cfg: MineConfig, rng: random.Random
) -> list[tuple[int, float]] | Dropped:
    """``cfg.negatives`` (document, score) pairs sampled (or the first, ``sampling: top``) from ranks
    ``cfg.rank_range`` of ``candidates`` once the positives, the likely false negatives (above
    ``max_score_ratio`` x the positive's score, or above it minus ``margin``) and those below ``min_score``
    are removed; why not, when the row is dropped.

    The filter comes before the ranks (NV-Retriever's TopK-PercPos, arXiv:2407.15831). Ranks counted
    before it drop every row whose positive the retriever ranks below the window: the queries the model
    gets wrong, which are the ones it has most to learn from (41% of the packages benchmark's rows with
    the base model, ``docs/results.md``)."""
    others = [c for c in candidates[: cfg.top_k + len(positives)] if c[0] not in positives]
    if cfg.positive_within is not None and sum(s > positive_score for _, s in others) >= cfg.positive_within:
        return Dropped.POSITIVE_WITHIN  # consistency filtering
    threshold = cfg.max_score_ratio * positive_score if positive_score > 0 else float("inf")  # a ratio of a
    # non-positive score says nothing about false negatives
    if cfg.margin is not None:
        threshold = min(threshold, positive_score - cfg.margin)
    floor = cfg.min_score if cfg.min_score is not None else float("-inf")
    ranked = [c for c in others if floor <= c[1] <= threshold]
    low, high = cfg.rank_range
    window = ranked[low - 1 : high]
    if len(window) < cfg.negatives:
        return Dropped.TOO_FEW
    chosen = window[: cfg.negatives] if cfg.sampling == "top" else rng.sample(window, cfg.negatives)
    return sorted(chosen, key=lambda c: -c[1])


def random_negatives(documents: int, positives: set[int], count: int, rng: random.Random) -> list[int] | None:
    """``count`` distinct documents of a corpus of ``documents``, none of them a positive, drawn with the
    row's ``rng``; None when the corpus holds too few others.

    >>> random_negatives(5, {0, 1}, 2, random.Random(0))
    [2, 3]
    >>> random_negatives(3, {0, 1}, 2, random.Random(0)) is None
    True
    """
    others = documents - len(positives)
    if others < count:
        return None
    chosen: set[int] = set()
    while len(chosen) < count:  # rejection: cheap while the positives are few against the corpus
        d = rng.randrange(documents)
        if d not in positives:
            chosen.add(d)
    return sorted(chosen)


def row_negatives(
    found: Candidates | None,
    positives: set[int],
    positive_score: float,
    short: bool,
    documents: int,
    cfg: MineConfig,
    rng: random.Random,
) -> tuple[list[tuple[int, float | None]], None] | tuple[list[tuple[int, float | None]] | None, Dropped]:
    """One row's negatives and, when the retriever's candidates did not serve, why: ``(chosen, None)``
    from the candidates; ``(drawn, reason)`` drawn at random (``mine.fallback: random``, no retriever
    score); ``(None, reason)`` when the row is dropped. ``found`` is None when BM25 could search no word
    of the query; ``short`` when the retriever returned fewer than it was asked for (BM25 scores 0 for
    documents sharing no word), so that too few left is the retriever's doing, not the settings'.

    >>> cfg = MineConfig(negatives=1, rank_range=[1, 2], top_k=2)
    >>> row_negatives([(3, 0.5), (4, 0.4)], {0}, 1.0, False, 5, cfg, random.Random(0))
    ([(4, 0.4)], None)
    >>> row_negatives(None, {0}, 1.0, False, 5, cfg, random.Random(0))
    ([(3, None)], <Dropped.NO_TERMS: 'no_terms'>)
    """
    why = Dropped.NO_TERMS if found is None else choose_negatives(found, positives, positive_score, cfg, rng)
    if not isinstance(why, Dropped):
        return list(why), None
    if why is Dropped.TOO_FEW and short:
        why = Dropped.UNMATCHED
    if why in FALLS_BACK and cfg.fallback == "random":
        drawn = random_negatives(documents, positives, cfg.negatives, rng)
        if drawn is not None:
            return [(d, None) for d in drawn], why
    return None, why


def explain_drops(dropped: dict[str, int], rows: int, documents: int, cfg: MineConfig) -> None:
    """A line per reason rows were dropped, naming the setting that changes it. Dropping can be right:
    on the quickstart, keeping the rows top_k 100 dropped (top_k 1000) lost most of mining's gain, while
    on the packages benchmark a quarter of the rows went (docs/results.md). The user should know which."""
    too_few = dropped.get(Dropped.TOO_FEW.value, 0)
    if too_few:
        fix = (
            "mine.corpus holds too few documents for that; add documents or lower mine.rank_range"
            if documents <= cfg.top_k + 1
            else f"raise mine.top_k (now {cfg.top_k}, at most 1000) to keep them"
        )
        (log.warning if too_few >= 0.05 * rows else log.info)(
            "mine: %d of %d rows (%.0f%%) dropped with fewer than %d candidates left in ranks %d-%d of the top %d "
            "below %.2f x the positive's score (the retriever ranks their positive low); %s",
            too_few,
            rows,
            100 * too_few / rows,
            cfg.negatives,
            *cfg.rank_range,
            cfg.top_k,
            cfg.max_score_ratio,
            fix,
        )
    if unsearchable := dropped.get(Dropped.NO_TERMS.value, 0):
        log.info(
            "mine: %d of %d rows dropped: their query holds no word BM25 can search for (stopwords, "
            "punctuation, one-letter words); mine.retriever: model keeps them",
            unsearchable,
            rows,
        )
    if unmatched := dropped.get(Dropped.UNMATCHED.value, 0):
        (log.warning if unmatched >= 0.05 * rows else log.info)(
            "mine: %d of %d rows dropped: BM25 scored too few documents above 0 for their query (a document "
            "sharing no word with it is never a negative); mine.retriever: model ranks every document",
            unmatched,
            rows,
        )
    if inconsistent := dropped.get(Dropped.POSITIVE_WITHIN.value, 0):
        log.info(
            "mine: %d of %d rows dropped: their positive ranks below mine.positive_within (%d)",
            inconsistent,
            rows,
            cfg.positive_within,
        )
