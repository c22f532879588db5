"""The corpus's token embeddings, stored beside the PLAID index for exact MaxSim at serving time.

``index.embeddings: true`` makes the index phase write, into the index's folder (under its manifest):

* ``corpus.safetensors``: ``embeddings`` (tokens, dim) float32, the scoring tokens of every document one after
  another, and ``offsets`` (documents + 1,) int64, where each document's tokens start;
* ``corpus-ids.json``: the document ids, in that order.

They are computed exactly as the trainer's evaluation computes them (``trainer/evaluate.py``: the same
``embed_texts``, chunks of ``DOC_CHUNK`` documents, the same batch size), so ``serve --exact`` ranks a query
as the evaluation did, bit for bit on the same device. float32, 4 x dim bytes a token: about 50 KB a
100-token document at dim 128, which is why it is asked for, not the default (PLAID's 4-bit residuals are
about an eighth of it).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from trainer.encode import embed_texts

__all__ = ["EMBEDDINGS", "IDS", "Corpus", "load_corpus", "write_corpus"]

EMBEDDINGS = "corpus.safetensors"
IDS = "corpus-ids.json"
DOC_CHUNK = 512  # as trainer/evaluate.py: the same chunks give the same embeddings


class Corpus:
    """Document ids and their embeddings padded to the longest document, ``(documents, tokens, dim)``, with the
    ``(documents, tokens)`` mask of the tokens that score."""

    def __init__(self, ids: list[str], embeddings: torch.Tensor, mask: torch.Tensor):
        self.ids, self.embeddings, self.mask = ids, embeddings, mask


@torch.no_grad()
def write_corpus(folder: Path, model, ids: list[str], texts: list[str], batch_size: int) -> None:
    """Encode ``texts`` as the evaluation does and write them (only the scoring tokens) into ``folder``."""
    from safetensors.torch import save_file

    device = next(model.parameters()).device
    model.eval()  # as the evaluation encodes: no dropout
    parts, lengths = [], []
    for start in range(0, len(texts), DOC_CHUNK):
        emb, mask = embed_texts(
            model, texts[start : start + DOC_CHUNK], False, batch_size, model.document_length, device
        )
        for e, m in zip(emb, mask):  # (tokens, dim), (tokens,)
            parts.append(e[m].cpu())
            lengths.append(int(m.sum()))
    offsets = torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0)
    save_file({"embeddings": torch.cat(parts).contiguous(), "offsets": offsets}, str(folder / EMBEDDINGS))
    (folder / IDS).write_text(json.dumps(ids))


def load_corpus(folder: Path, length: int, device: torch.device | str = "cpu") -> Corpus:
    """The stored corpus, padded back to ``length`` tokens (the model's document length) with zeros where the mask
    is off, as the evaluation pads: a document with fewer scoring tokens than ``length`` then has a masked
    position, which MaxSim counts as a similarity of 0 there too."""
    from safetensors.torch import load_file

    stored = load_file(str(folder / EMBEDDINGS))
    flat, offsets = stored["embeddings"], stored["offsets"]
    ids = json.loads((folder / IDS).read_text())
    lengths = (offsets[1:] - offsets[:-1]).tolist()
    width = max([length, *lengths])
    embeddings = torch.zeros(len(lengths), width, flat.shape[1], dtype=flat.dtype)
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for i, (start, n) in enumerate(zip(offsets[:-1].tolist(), lengths)):
        embeddings[i, :n] = flat[start : start + n]
        mask[i, :n] = True
    return Corpus(ids, embeddings.to(device), mask.to(device))
