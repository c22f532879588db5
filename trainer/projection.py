"""How a new ColBERT projection starts: PyLate's random layer, or the base model's own principal directions.

A base model that is not a ColBERT (all-MiniLM-L6-v2, any sentence-transformers or BERT checkpoint) gets a
new linear layer, hidden size -> ``model.embedding_size``, that PyLate initialises at random. At step 0 its
MaxSim ranks documents through an arbitrary 128-dimensional shadow of the encoder's token embeddings
(NFCorpus dev: 0.138 nDCG@10). With ``model.projection_init: principal`` the layer's rows are the top
principal directions of the base model's own token embeddings over the training documents, uncentred: the
directions that keep most of the embeddings' dot products, so MaxSim starts close to MaxSim over the
encoder's full-width embeddings (0.169 on NFCorpus dev). What it buys after training: docs/results.md.

Every rank computes the same directions from the same documents; DDP then starts every rank from rank 0's
weights anyway (trainer/grad_sync.py), so a GPU's last-digit differences cannot split the ranks.
"""

from __future__ import annotations

import logging

import torch

from trainer.config.schema import ConfigError, ModelConfig
from trainer.data.rows import ROWS_PER_BATCH, Rows
from trainer.model_kind import model_config, module_types

__all__ = [
    "SAMPLE_DOCUMENTS",
    "check_new_projection",
    "check_width",
    "encoder_width",
    "first_documents",
    "has_projection",
    "principal_directions",
    "start_projection",
]

log = logging.getLogger("trainer")

PYLATE_EMBEDDING_SIZE = 128  # PyLate's width for a new projection when model.embedding_size is unset
SAMPLE_DOCUMENTS = 256  # the first distinct documents: ~30k token vectors at 128 tokens, seconds on a CPU


def first_documents(rows: Rows, n: int) -> list[str]:
    """Up to ``n`` distinct documents of ``rows`` in file order (a row's positive, then its negatives): the
    same on every rank, read a record batch's worth of rows at a time until there are enough."""
    seen: dict[str, None] = {}
    for start in range(0, len(rows), ROWS_PER_BATCH):
        _, documents, _ = rows.take(list(range(start, min(len(rows), start + ROWS_PER_BATCH))))
        for docs in documents:
            seen.update(dict.fromkeys(docs))
            if len(seen) >= n:
                return list(seen)[:n]
    return list(seen)


def has_projection(name_or_path: str) -> bool:
    """Whether the model already has layers after its encoder (a ColBERT checkpoint, or a sentence-transformers
    model with a Dense module), read from its ``modules.json`` where that is at hand."""
    return any(t.endswith("Dense") for t in module_types(name_or_path))


def encoder_width(name_or_path: str) -> int | None:
    """The encoder's hidden size, read from the model's ``config.json`` where that is at hand (None where it is
    not, or names no ``hidden_size``): enough to refuse a too-wide projection before mining."""
    width = model_config(name_or_path).get("hidden_size")
    return width if isinstance(width, int) else None


def check_new_projection(cfg: ModelConfig) -> None:
    """``principal`` only where the projection will be new and no wider than the encoder: called by the job's
    staging, before mining, and again when the model is built (where the encoder's width is certain)."""
    if has_projection(cfg.name_or_path):
        raise ConfigError(
            f"model.projection_init: principal starts a new projection, but {cfg.name_or_path} already has one; "
            "leave model.projection_init at random to train the model's own"
        )
    hidden = encoder_width(cfg.name_or_path)
    if hidden is not None:
        check_width(cfg.embedding_size or PYLATE_EMBEDDING_SIZE, hidden)


def check_width(size: int, hidden: int) -> None:
    """A principal projection keeps ``size`` of the encoder's ``hidden`` directions: it cannot keep more."""
    if size > hidden:
        raise ConfigError(
            f"model.projection_init: principal keeps {size} of the encoder's {hidden} directions, which it has "
            f"not; set model.embedding_size to {hidden} or less, or leave model.projection_init at random"
        )


def principal_directions(embeddings: torch.Tensor, k: int) -> torch.Tensor:
    """The top ``k`` eigenvectors of the uncentred second moment of ``embeddings`` (rows are vectors), as the
    rows of a ``k x dim`` matrix; each one's largest entry made positive, so the answer is one matrix.

    >>> x = torch.tensor([[0.0, -3.0, 0.0], [0.0, -2.0, 0.0], [-1.0, 0.0, 0.0]])
    >>> principal_directions(x, 2)
    tensor([[0., 1., 0.],
            [1., 0., 0.]])
    """
    x = embeddings.double()
    values, vectors = torch.linalg.eigh(x.T @ x)  # ascending eigenvalues
    top = vectors[:, values.argsort(descending=True)[:k]].T
    signs = torch.sign(top.gather(1, top.abs().argmax(dim=1, keepdim=True)))
    return (top * signs).to(embeddings.dtype)


@torch.no_grad()
def start_projection(model, cfg: ModelConfig, documents: list[str], batch_size: int = 32) -> None:
    """Set the new projection of ``model`` (a PyLate ColBERT built from ``cfg``) to the principal directions
    of its encoder's token embeddings over ``documents``; a model with its own projection is refused."""
    check_new_projection(cfg)
    dense = model[1]
    hidden, size = dense.linear.in_features, dense.linear.out_features
    check_width(size, hidden)
    if not documents:
        raise ConfigError("model.projection_init: principal needs documents in data.train; none were read")
    was_training = model.training
    model.eval()  # no dropout in the directions
    vectors = []
    for start in range(0, len(documents), batch_size):
        features = model.tokenize(documents[start : start + batch_size], is_query=False)
        features = {k: v.to(dense.linear.weight.device) for k, v in features.items()}
        out = model[0](features)
        mask = out["attention_mask"].bool()
        vectors.append(out["token_embeddings"][mask].float().cpu())
    model.train(was_training)
    tokens = torch.cat(vectors)
    dense.linear.weight.copy_(principal_directions(tokens, size).to(dense.linear.weight))
    if dense.linear.bias is not None:
        dense.linear.bias.zero_()
    log.info(
        "projection: the top %d principal directions of %d token embeddings (%d documents, width %d)",
        size,
        len(tokens),
        len(documents),
        hidden,
    )
