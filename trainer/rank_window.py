"""``mine.rank_range: auto``: the ranks negatives come from, chosen from the user's data.

Which window teaches depends on how the data is labelled. With about one relevant document per query, labelled
(SciFact), the documents just below the positive are true hard negatives. With many relevant documents per query,
most unlabelled (NFCorpus), the shallow "negatives" are often positives, and deeper ranks teach instead. Users do
not know which regime their data is in; the retriever tells: where it ranks the labelled positives. A labelled
positive it usually ranks first means labels that look complete; one usually ranked deep means many unlabelled
relevant documents above it. :func:`auto_rank_range` maps that to the window measured best in each regime
(``trainer/config/mine.py``: ``AUTO_WINDOWS``, figures in docs/results.md).

The choice is made once per mining pass from a seeded sample of queries (:func:`choose`), the same on any world
size and restart (the search is), and written beside the mined parts (:data:`CHOSEN`) so a resumed pass, the log
and ``mining.json`` (:func:`stats`) read the window the parts were mined with (:func:`chosen`).
"""

from __future__ import annotations

import json
import logging
import random
import statistics
from pathlib import Path

from trainer import distributed as D
from trainer.atomic import write_text
from trainer.config.mine import AUTO_WINDOWS, COMPLETE_AT, MineConfig
from trainer.config.schema import TrainConfig
from trainer.retrieval.search import Candidates

__all__ = ["CHOSEN", "SAMPLE", "auto_rank_range", "choose", "chosen", "positive_rank", "stats"]

log = logging.getLogger("trainer")

CHOSEN = "rank_range.json"  # the window chosen for the mined parts beside it, and why
SAMPLE = 512  # queries whose labelled positives' ranks choose the window


def positive_rank(candidates: Candidates | None, positives: set[int], positive_score: float) -> int:
    """Where the retriever ranks a labelled positive among the documents not labelled for its query: 1 + the
    candidates scoring above it (beyond the top_k: one past them all).

    >>> positive_rank([(7, 0.9), (0, 0.8), (5, 0.7)], {0}, 0.8)
    2
    """
    return 1 + sum(s > positive_score for d, s in candidates or [] if d not in positives)


def auto_rank_range(ranks: list[int]) -> tuple[list[int], dict]:
    """``mine.rank_range: auto``: the window negatives come from, chosen by where the retriever ranks the
    labelled positives (:func:`positive_rank` over a sample of rows), and why.

    A labelled positive the retriever usually ranks first means labels that look complete (about one relevant
    document per query, labelled): the documents just below it are true hard negatives. A labelled positive
    usually ranked deep means many unlabelled relevant documents rank above it (incomplete labels): shallow
    "negatives" are often positives, and deeper ranks teach instead.

    >>> auto_rank_range([1, 1, 2, 9])[0]
    [3, 30]
    >>> window, why = auto_rank_range([40, 160, 3, 900])
    >>> window, why["median_positive_rank"], why["labels"]
    ([30, 100], 100.0, 'incomplete')
    """
    median = float(statistics.median(ranks))
    labels = "complete" if median <= COMPLETE_AT else "incomplete"
    why = {
        "labels": labels,
        "median_positive_rank": median,
        "share_positive_in_top_3": round(sum(r <= 3 for r in ranks) / len(ranks), 3),
        "rows_sampled": len(ranks),
    }
    return list(AUTO_WINDOWS[labels]), why


def choose(cfg: TrainConfig, pairs, rows_of: dict, retriever, out_dir: Path, writes: bool) -> MineConfig:
    """``mine.rank_range: auto`` made concrete (:func:`auto_rank_range`) from where ``retriever``
    ranks the labelled positives of a seeded sample of queries: the same choice on any world size and on every
    restart (the search is), written beside the parts for the log, mining.json and a later join."""
    queries = sorted(
        random.Random(f"auto-{cfg.training.seed}").sample(range(len(pairs.queries)), min(SAMPLE, len(pairs.queries)))
    )
    found, scores = retriever.search(
        [pairs.queries[q] for q in queries], [pairs.positives[q] for q in queries], cfg.mine.top_k
    )
    ranks = [
        positive_rank(cands, pairs.positives[q], score.get(pairs.rows[row][1], 0.0))
        for q, cands, score in zip(queries, found, scores)
        for row in rows_of[q]
    ]
    window, why = auto_rank_range(ranks)
    if D.rank() == 0:
        log.info(
            "mine: rank_range auto -> %s: the retriever ranks the labelled positive %g in the median (%.0f%% in "
            "its top 3, %d rows of %d queries): labels look %s, so negatives come from ranks %d-%d",
            window,
            why["median_positive_rank"],
            100 * why["share_positive_in_top_3"],
            len(ranks),
            len(queries),
            why["labels"],
            *window,
        )
    if writes:
        write_text(out_dir / CHOSEN, json.dumps({"rank_range": window, "why": why}, indent=2) + "\n")
    return cfg.mine.model_copy(update={"rank_range": window})


def chosen(mcfg: MineConfig, out_dir: Path) -> MineConfig:
    """``mcfg`` with ``rank_range: auto`` replaced by the window the parts in ``out_dir`` were mined with."""
    if mcfg.rank_range != "auto":
        return mcfg
    return mcfg.model_copy(update={"rank_range": json.loads((out_dir / CHOSEN).read_text())["rank_range"]})


def stats(out_dir: Path) -> dict:
    """``mining.json``'s entry for the chosen window and why (nothing for a window the config gives)."""
    if not (out_dir / CHOSEN).is_file():
        return {}
    saved = json.loads((out_dir / CHOSEN).read_text())
    return {"rank_range": {"auto": saved["rank_range"], **saved["why"]}}
