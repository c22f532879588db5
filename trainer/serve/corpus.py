"""The corpus's token embeddings, stored beside the PLAID index for exact MaxSim at serving time.

``index.embeddings: true`` makes the index phase write, into the index's folder (under its manifest):

* ``corpus.safetensors``: ``embeddings`` (tokens, dim) float32, the scoring tokens of every document one after
  another; ``offsets`` (documents + 1,), where each document's tokens start; ``widths`` (chunks,), the width
  each chunk of ``DOC_CHUNK`` documents is scored at;
* beside ``corpus-ids.json``, the document ids in that order (which the index phase writes with every index).

They are the embeddings the trainer's evaluation scores (``trainer/evaluate.py`` through
``trainer/retrieval/exact.py``: the same ``embed_texts``, the same chunks, float32, trimmed at the same
column), and :func:`load_corpus` gives them back in those chunks, so ``serve --exact`` ranks a query as the
evaluation did. 4 x dim bytes a token: about 50 KB a 100-token document at dim 128, which is why it is asked
for, not the default (PLAID's 4-bit residuals are about an eighth of it).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from trainer.encode import embed_texts
from trainer.retrieval.exact import scoring_width
from trainer.retrieval.search import DOC_CHUNK

__all__ = ["EMBEDDINGS", "IDS", "load_corpus", "write_corpus"]

EMBEDDINGS = "corpus.safetensors"
IDS = "corpus-ids.json"


@torch.no_grad()
def write_corpus(folder: Path, model, texts: list[str], batch_size: int) -> None:
    """Encode ``texts`` as the evaluation does and write their scoring tokens, and each chunk's width, into
    ``folder`` (their ids are the index phase's ``corpus-ids.json``)."""
    from safetensors.torch import save_file

    device = next(model.parameters()).device
    model.eval()  # as the evaluation encodes: no dropout
    parts, lengths, widths = [], [], []
    for start in range(0, len(texts), DOC_CHUNK):
        chunk = texts[start : start + DOC_CHUNK]
        emb, mask = embed_texts(model, chunk, False, batch_size, model.document_length, device)
        widths.append(scoring_width(mask))
        for e, m in zip(emb, mask):  # (tokens, dim), (tokens,)
            parts.append(e[m].float().cpu())
            lengths.append(int(m.sum()))
    offsets = torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0)
    tensors = {"embeddings": torch.cat(parts).contiguous(), "offsets": offsets, "widths": torch.tensor(widths)}
    save_file(tensors, str(folder / EMBEDDINGS))


def load_corpus(folder: Path, device: torch.device | str = "cpu") -> tuple[list[str], list[tuple]]:
    """The ids, and the chunks as the evaluation scores them: ``(first document, embeddings (documents, width,
    dim), mask (documents, width))``, zeros where the mask is off."""
    from safetensors.torch import load_file

    stored = load_file(str(folder / EMBEDDINGS))
    flat, offsets, widths = stored["embeddings"], stored["offsets"].tolist(), stored["widths"].tolist()
    ids = json.loads((folder / IDS).read_text())
    chunks = []
    for c, width in enumerate(widths):
        first, last = c * DOC_CHUNK, min(len(ids), (c + 1) * DOC_CHUNK)
        emb = torch.zeros(last - first, width, flat.shape[1], dtype=flat.dtype)
        mask = torch.zeros(last - first, width, dtype=torch.bool)
        for row, doc in enumerate(range(first, last)):
            n = offsets[doc + 1] - offsets[doc]
            emb[row, :n], mask[row, :n] = flat[offsets[doc] : offsets[doc + 1]], True
        chunks.append((first, emb.to(device), mask.to(device)))
    return ids, chunks
