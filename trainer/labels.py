"""How complete the training labels look, read from where the mining retriever ranks them, and the softmax
temperature that follows from it (``loss.temperature: auto``).

Two kinds of data need two temperatures. Where each query has about one relevant document and it is labelled
(complete labels), the base model usually ranks the labelled positive first: the positive already stands out, a
sharp softmax (0.25) leaves most rows at a near-zero loss within a few steps, and PyLate's 1 keeps them teaching.
Where most relevant documents are unlabelled (incomplete labels), the labelled positive usually ranks far down,
behind documents that are relevant too: there the sharper softmax scored higher. Both were measured on two real
sets, one of each kind, against the other value (docs/results.md).

The signal costs one search of a seeded sample of queries with the retriever mining already built, and it is the
same on any world size and on every restart (the search is; the sample is seeded). Mining writes it beside the
mined rows (``labels.json``); the job reads it back before training.
"""

from __future__ import annotations

import random
import statistics
from typing import Any

__all__ = [
    "COMPLETE_AT",
    "FILE",
    "SAMPLE",
    "TEMPERATURES",
    "describe",
    "describe_line",
    "explain",
    "measure",
    "positive_rank",
    "temperature_for",
]

COMPLETE_AT = 3  # labels look complete when the median labelled positive ranks at or above this
TEMPERATURES = {"complete": 1.0, "incomplete": 0.25}  # loss.temperature: auto, by how the labels look
SAMPLE = 512  # queries whose labelled positives are ranked
FILE = "labels.json"  # beside the first round's mined rows: what measure() found


def positive_rank(candidates, positives: set[int], positive_score: float) -> int:
    """Where the retriever ranks a labelled positive among the documents not labelled for its query: 1 + the
    candidates scoring above it (beyond the top_k: one past them all).

    >>> positive_rank([(7, 0.9), (0, 0.8), (5, 0.7)], {0}, 0.8)
    2
    >>> positive_rank(None, {0}, 0.1)  # a query the retriever could not search (BM25: no word left)
    1
    """
    return 1 + sum(s > positive_score for d, s in candidates or [] if d not in positives)


def describe(ranks: list[int]) -> dict[str, Any]:
    """The labels' structure from the positives' ranks: ``labels`` (complete or incomplete) and the figures
    behind it.

    >>> describe([1, 1, 2, 9])["labels"]
    'complete'
    >>> d = describe([40, 160, 3, 900])
    >>> d["labels"], d["median_positive_rank"], d["share_positive_in_top_3"]
    ('incomplete', 100.0, 0.25)
    """
    median = float(statistics.median(ranks))
    return {
        "labels": "complete" if median <= COMPLETE_AT else "incomplete",
        "median_positive_rank": median,
        "share_positive_in_top_3": round(sum(r <= 3 for r in ranks) / len(ranks), 3),
        "rows_sampled": len(ranks),
    }


def measure(retriever, pairs, rows_of: dict[int, list[int]], seed: int, top_k: int) -> dict[str, Any]:
    """:func:`describe` of the ranks ``retriever`` gives the labelled positives of a seeded sample of
    ``pairs``'s queries (every rank calls it alike: the search is a collective)."""
    queries = sorted(random.Random(f"labels-{seed}").sample(range(len(pairs.queries)), min(SAMPLE, len(pairs.queries))))
    found, scores = retriever.search([pairs.queries[q] for q in queries], [pairs.positives[q] for q in queries], top_k)
    ranks = [
        positive_rank(cands, pairs.positives[q], score.get(pairs.rows[row][1], 0.0))
        for q, cands, score in zip(queries, found, scores)
        for row in rows_of[q]
    ]
    return {**describe(ranks), "queries_sampled": len(queries)}


def temperature_for(structure: dict[str, Any]) -> float:
    """``loss.temperature: auto`` for labels of this structure.

    >>> temperature_for({"labels": "complete"}), temperature_for({"labels": "incomplete"})
    (1.0, 0.25)
    """
    return TEMPERATURES[structure["labels"]]


def describe_line(structure: dict[str, Any]) -> str:
    """What the retriever found, in words, for the mining log.

    >>> describe_line({"labels": "incomplete", "median_positive_rank": 546.0, "share_positive_in_top_3": 0.065})
    'the retriever ranks the labelled positive 546 in the median (6% in its top 3): labels look incomplete'
    """
    return (
        f"the retriever ranks the labelled positive {structure['median_positive_rank']:g} in the median "
        f"({100 * structure['share_positive_in_top_3']:.0f}% in its top 3): labels look {structure['labels']}"
    )


def explain(structure: dict[str, Any]) -> str:
    """The temperature ``auto`` chose and why, for the training log and the card.

    >>> explain({"labels": "complete", "median_positive_rank": 1.0, "share_positive_in_top_3": 0.68})[:40]
    'temperature 1 (auto): the retriever rank'
    """
    return f"temperature {temperature_for(structure):g} (auto): {describe_line(structure)}"
