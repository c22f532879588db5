"""Turn token ids into masked, L2-normalised ColBERT token embeddings of a fixed length.

Every rank pads document embeddings to the same length, so that ``all_gather`` (which needs equal
shapes) sees identical tensors on every rank whatever the longest document of its local batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.grad_sync import unwrap

__all__ = ["Encoded", "embed_texts", "encode", "encode_batch", "group_documents", "pad_tokens"]


class Encoded:
    """Embeddings ``(n, tokens, dim)`` with a ``(n, tokens)`` mask of the tokens that score."""

    def __init__(self, embeddings: torch.Tensor, mask: torch.Tensor):
        self.embeddings = embeddings
        self.mask = mask


def pad_tokens(t: torch.Tensor, length: int, value: float = 0.0) -> torch.Tensor:
    """Right-pad dim 1 of ``t`` to ``length``."""
    extra = length - t.shape[1]
    if extra <= 0:
        return t[:, :length]
    pad = [0, 0] * (t.dim() - 2) + [0, extra]
    return F.pad(t, pad, value=value)


def encode(model, features: dict[str, torch.Tensor], is_query: bool, length: int) -> Encoded:
    """Run the ColBERT model on one tokenised batch.

    Documents drop padding and skiplist (punctuation) tokens from the mask; queries keep every
    token, expansion ([MASK]) tokens included, as PyLate does with query expansion.
    """
    out = model(dict(features))  # through DDP's wrapper when training on several ranks
    emb = F.normalize(out["token_embeddings"], p=2, dim=-1)  # (n, tokens, dim)
    if is_query:
        mask = torch.ones(emb.shape[:2], dtype=torch.bool, device=emb.device)
    else:
        skiplist = torch.tensor(unwrap(model).skiplist, device=emb.device)
        skip = torch.isin(features["input_ids"], skiplist)
        mask = features["attention_mask"].bool() & ~skip  # (n, tokens)
    return Encoded(pad_tokens(emb, length), pad_tokens(mask, length, value=False))


def group_documents(embeddings: torch.Tensor, mask: torch.Tensor, docs_per_query: int):
    """``(b * n_docs, tokens, dim)`` -> ``(b, n_docs, tokens, dim)``, and the mask alike (query-major rows)."""
    b = embeddings.shape[0] // docs_per_query
    return embeddings.view(b, docs_per_query, *embeddings.shape[1:]), mask.view(b, docs_per_query, -1)


def encode_batch(model, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries ``(b, q_tokens, dim)``, documents ``(b, n_docs, d_tokens, dim)`` and their mask, with a graph."""
    q = encode(model, batch.queries, is_query=True, length=batch.query_length)
    d = encode(model, batch.documents, is_query=False, length=batch.document_length)
    return (q.embeddings, *group_documents(d.embeddings, d.mask, batch.docs_per_query))


@torch.no_grad()
def embed_texts(
    model, texts: list[str], is_query: bool, batch_size: int, length: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Embeddings ``(n, length, dim)`` (float32) and masks of ``texts``, ``batch_size`` at a time, without
    a graph: evaluation and mining."""
    embs, masks = [], []
    for i in range(0, len(texts), batch_size):
        feats = {k: v.to(device) for k, v in model.tokenize(texts[i : i + batch_size], is_query=is_query).items()}
        enc = encode(model, feats, is_query, length)
        embs.append(enc.embeddings.float())
        masks.append(enc.mask)
    return torch.cat(embs), torch.cat(masks)
