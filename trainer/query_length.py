"""``model.query_length: auto``: a query length that fits the user's own queries.

ColBERT pads every query to ``query_length`` tokens with [MASK] tokens (query expansion), and each of them is a
query vector that MaxSim sums over. A base model that is not yet a ColBERT never learnt what those vectors
should do: where the queries are short, most of a query's vectors are theirs (NFCorpus's titles: 7 tokens in
the median, 25 of 32 vectors expansion), and at a short training budget that cost nDCG@10 against 16 tokens.
So ``auto`` reads a seeded sample of the training queries with the base model's tokenizer and takes the smallest
multiple of :data:`STEP` that holds :data:`SHARE` of them, the [Q] marker included, at least :data:`SHORTEST`
and at most :data:`PYLATE`, PyLate's 32: lengthening it for long queries (SciFact's claims, 12% longer than 32
tokens, at 40) measured level, not better, so ``auto`` only shortens. A base model that is a ColBERT already
keeps the length it was trained with.

The sample and the tokenizer are the same on every rank and restart, so every process computes the same length;
the job logs it with its reason, records it in ``metrics.json`` and the card, and the final model is saved with it
(serving and the index read it from there).
"""

from __future__ import annotations

import math
import random
import statistics

from trainer.config.schema import TrainConfig

__all__ = ["PYLATE", "SAMPLE", "SHARE", "SHORTEST", "STEP", "choose", "explain", "resolved", "token_counts"]

SAMPLE = 4096  # training queries read (seeded): enough for a 95th percentile, cheap on any data set
SHARE = 0.95  # of the sampled queries that fit whole
STEP = 8  # lengths are multiples of it
SHORTEST = 8  # a floor for data of one-word queries
PYLATE = 32  # PyLate's query length: auto's ceiling (it shortens, never lengthens), a ColBERT's where it does not say


def choose(lengths: list[int], limit: int) -> int:
    """The smallest multiple of :data:`STEP` that holds :data:`SHARE` of ``lengths`` (token counts, marker
    included), at least :data:`SHORTEST` and at most :data:`PYLATE` (or the model's ``limit``, if lower).

    >>> choose([7] * 90 + [14] * 7 + [30] * 3, 512)  # short titles: 97% fit in 16
    16
    >>> choose([22] * 60 + [38] * 36 + [50] * 4, 512)  # long claims: PyLate's 32 (96% would fit in 40)
    32
    >>> choose([3, 4], 512), choose([20], 16)
    (8, 16)
    """
    ordered = sorted(lengths)
    needed = ordered[max(0, math.ceil(SHARE * len(ordered)) - 1)]
    return max(SHORTEST, min(limit, PYLATE, STEP * math.ceil(needed / STEP)))


def explain(chosen: int, lengths: list[int]) -> str:
    """The line the log, ``metrics.json`` and the card give.

    >>> explain(16, [7] * 90 + [14] * 7 + [30] * 3)
    'query_length 16 (auto): 97% of 100 training queries fit (median 7 tokens with the [Q] marker)'
    >>> explain(32, [22] * 80 + [40] * 20).split("; ")[1]
    'the rest are cut (auto stops at 32: set a number to keep them whole)'
    """
    fit = sum(n <= chosen for n in lengths) / len(lengths)
    line = (
        f"query_length {chosen} (auto): {100 * fit:.0f}% of {len(lengths):,} training queries fit "
        f"(median {statistics.median(lengths):g} tokens with the [Q] marker)"
    )
    if fit < SHARE:
        line += f"; the rest are cut (auto stops at {PYLATE}: set a number to keep them whole)"
    return line


def resolved(cfg: TrainConfig) -> tuple[TrainConfig, str | None]:
    """``cfg`` with ``model.query_length: auto`` replaced by its value, and the line that says why (None where
    the config set a number)."""
    if cfg.model.query_length != "auto":
        return cfg, None
    from trainer.model import resolve_model_path
    from trainer.model_kind import colbert_config, model_config, model_kind

    path = resolve_model_path(cfg.model.name_or_path)
    if model_kind(path) == "colbert":
        own = int(colbert_config(path).get("query_length") or PYLATE)
        why = f"query_length {own} (auto): the base model is a ColBERT, which keeps the length it was trained with"
        return _with(cfg, own), why
    lengths = _token_lengths(cfg, path)
    chosen = choose(lengths, int(model_config(path).get("max_position_embeddings") or 512))  # the model's own limit
    return _with(cfg, chosen), explain(chosen, lengths)


def token_counts(tokenizer, queries: list[str]) -> list[int]:
    """Each query's tokens as a ColBERT counts them before it cuts to ``query_length``: the tokenizer's, special
    tokens included, plus the [Q] marker PyLate inserts (serving's count of cut queries is the same)."""
    ids = tokenizer(queries, add_special_tokens=True, verbose=False)["input_ids"]  # verbose: no "longer than 512"
    return [len(one) + 1 for one in ids]


def _with(cfg: TrainConfig, length: int) -> TrainConfig:
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"query_length": length})})


def _token_lengths(cfg: TrainConfig, path: str) -> list[int]:
    """Token counts of a seeded sample of the training queries (special tokens and the [Q] marker included)."""
    from transformers import AutoTokenizer

    from trainer.data import load_rows

    if cfg.mine is not None:  # the user's pairs, which mining makes the rows from (a distillation job's too)
        rows = load_rows(cfg.data.train.pairs(), distillation=False, cache_dir=cfg.data.cache_dir)
    else:
        rows = load_rows(cfg.data.train, distillation=cfg.loss.scored, cache_dir=cfg.data.cache_dir)
    picked = sorted(random.Random(f"query-length-{cfg.training.seed}").sample(range(len(rows)), min(SAMPLE, len(rows))))
    queries, _, _ = rows.take(picked)
    return token_counts(AutoTokenizer.from_pretrained(path), queries)
