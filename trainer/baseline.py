"""What the user started from, and the gate that keeps a trained model below it from leaving the volume.

A ColBERT built on a sentence-transformers model starts with a new projection, so the untrained ColBERT (the
evaluation "before training") is not what the user had: they had the base model as it ships, a bi-encoder
with its own pooling. That model is measured on the held-out split before training, beside the untrained
ColBERT, and ``metrics.json`` and the card show base, start and trained side by side. A base model that is
already a PyLate ColBERT is its own start: it is measured as itself, once (the "before" figures).

Before the export (and the registration after it), :func:`check_not_below_base` compares the trained model's
``evaluation.metric`` with the base model's: a trained model below it is not exported or registered unless
``export.allow_regression: true``; the model stays in ``output_dir`` and the job ends with one line naming
both figures (exit 2: retrying the same job gives the same model).

>>> check_not_below_base({"after": {"ndcg@10": 0.31}, "base": {"ndcg@10": 0.30}}, "ndcg@10", False)
>>> check_not_below_base({"after": {"ndcg@10": 0.30}}, "ndcg@10", False)  # no base measured: nothing to hold to
>>> check_not_below_base({"after": {"ndcg@10": 0.29}, "base": {"ndcg@10": 0.30}}, "ndcg@10", True)
>>> check_not_below_base({"after": {"ndcg@10": 0.29}, "base": {"ndcg@10": 0.30}}, "ndcg@10", False)
... # doctest: +ELLIPSIS
Traceback (most recent call last):
...
trainer.baseline.BelowBase: the trained model scores ndcg@10 0.2900 on the held-out split, below the base model ...
"""

from __future__ import annotations

import logging
import time

from trainer.errors import JobVerdict

__all__ = ["BelowBase", "base_kind", "check_not_below_base", "evaluate_base", "figures", "measure_base"]

log = logging.getLogger("trainer")


class BelowBase(JobVerdict):
    """The trained model scores below the base model as it ships: not exported (exit 2, permanent)."""


def base_kind(name_or_path: str) -> str | None:
    """``bi-encoder`` (a sentence-transformers model with a Pooling module), ``colbert`` (a PyLate model) or
    None (neither, or its files are not at hand without a download): :func:`trainer.model_kind.model_kind`."""
    from trainer.model_kind import model_kind

    kind = model_kind(name_or_path)
    return kind if kind in ("bi-encoder", "colbert") else None


def evaluate_base(name_or_path: str, split, batch_size: int, device) -> dict[str, float] | None:
    """The base model as it ships, on ``split``: a bi-encoder by exact cosine over its own pooled embeddings
    (``trainer/retrieval/dense.py``, sharded over ranks like every search, the same figures on every rank);
    None for a ColBERT base (the evaluation before training measures it as itself) or a model of neither kind."""
    if base_kind(name_or_path) != "bi-encoder":
        return None
    from trainer.evaluate import TOP_K, retrieval_metrics, run_of
    from trainer.retrieval.dense import DenseRetriever, load_bi_encoder

    started = time.perf_counter()
    model = load_bi_encoder(name_or_path, device)
    found, _ = DenseRetriever(model, split.corpus, batch_size, show=False).search(
        split.queries, [set() for _ in split.queries], TOP_K
    )
    del model
    result = retrieval_metrics(run_of(split, found), {q: split.qrels[q] for q in split.query_ids})
    return {**result, "seconds": round(time.perf_counter() - started, 2)}


def measure_base(cfg, split, device, is_main: bool) -> tuple[dict | None, str | None]:
    """The base model's figures when the job is held to them (the evaluation before training asked for, or an
    export to hold back), and the base model's kind. Measuring draws nothing from the run's RNG streams (a model
    being loaded may): the run trains as it would without it."""
    import torch

    if not (cfg.evaluation.before_training or cfg.export is not None):
        return None, None
    kind = base_kind(cfg.model.name_or_path)
    if kind != "bi-encoder":
        return None, kind
    with torch.random.fork_rng(devices=[device] if torch.device(device).type == "cuda" else []):
        base = evaluate_base(cfg.model.name_or_path, split, cfg.evaluation.batch_size, device)
    if is_main:
        log.info("eval of the base model as it ships (a bi-encoder): %s", figures(base))
    return base, kind


def figures(result: dict) -> str:
    """
    >>> figures({"ndcg@10": 0.5, "mrr@10": 0.25})
    'ndcg@10=0.5000 mrr@10=0.2500'
    """
    return " ".join(f"{k}={v:.4f}" for k, v in result.items())


def check_not_below_base(metrics: dict, metric: str, allow_regression: bool) -> None:
    """Raise :class:`BelowBase` when the trained model (``metrics["after"]``) scores below the base model
    (``metrics["base"]``) on ``metric``, unless ``allow_regression``. Nothing to compare: nothing raised."""
    base, after = (metrics.get("base") or {}).get(metric), (metrics.get("after") or {}).get(metric)
    if base is None or after is None or after >= base:
        return
    line = (
        f"the trained model scores {metric} {after:.4f} on the held-out split, below the base model as it ships "
        f"({base:.4f})"
    )
    if allow_regression:
        log.warning("%s: exported anyway (export.allow_regression)", line)
        return
    raise BelowBase(
        f"{line}: not exported or registered; the model is kept in output_dir (final-model); train longer or on "
        "other negatives, or set export.allow_regression: true to export it anyway"
    )
