"""The base model as the bi-encoder it was trained to be: its own pooling, cosine similarity, exact search.

Why a miner of its own: a ColBERT built on a sentence-transformers model starts with a new, random
projection, so before training it ranks by another notion of similarity than the model it becomes a few
dozen steps later, and the negatives it mines turn easy fast (on NFCorpus the loss fell to about 0.1 by
step 30). The base model's own pooling is what its pre-training tuned: on NFCorpus all-MiniLM-L6-v2 as a
bi-encoder scores 0.3167 nDCG@10 on test, above any 48-step ColBERT trained here. Cheap as well: one vector
per document and a matrix product, where exact MaxSim scores every token pair.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from trainer.retrieval.search import DOC_CHUNK, Candidates, TopK, my_chunks

__all__ = ["DenseRetriever", "load_bi_encoder"]


def load_bi_encoder(path: str, device):
    """The sentence-transformers model at ``path`` with its own pooling (mean pooling if it has none)."""
    from sentence_transformers import SentenceTransformer

    from trainer.model import resolve_model_path

    return SentenceTransformer(resolve_model_path(path), device=str(device))


class DenseRetriever:
    """Cosine over the bi-encoder's normalised embeddings. The corpus is cut into the fixed chunks every
    retriever uses, dealt round-robin to the ranks; each chunk is encoded in one call (the same batches on
    any world size), so the candidates are the same bytes on 1 rank or 64."""

    @classmethod
    def build(cls, model, corpus, mcfg, show, on_chunk, **_) -> DenseRetriever:
        return cls(model, corpus, mcfg.batch_size, show, on_chunk)

    def __init__(self, model, corpus: list[str], batch_size: int, show: bool, on_chunk=lambda: None):
        self.model, self.batch_size = model, batch_size
        self.chunks: list[tuple[int, torch.Tensor]] = []
        model.eval()
        for start in tqdm(my_chunks(len(corpus)), desc="mine: encode corpus", disable=not show, unit="chunk"):
            self.chunks.append((start, self._encode(corpus[start : start + DOC_CHUNK])))
            on_chunk()

    def _encode(self, texts: list[str]) -> torch.Tensor:
        emb = self.model.encode(
            texts,
            batch_size=self.batch_size,
            convert_to_tensor=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return emb.float().cpu()  # (texts, dim)

    @torch.no_grad()
    def search(self, queries: list[str], positives: list[set[int]], k: int) -> tuple[list[Candidates], list[dict]]:
        q = self._encode(queries)
        best = TopK(positives, k + max(len(p) for p in positives))
        for start, d in self.chunks:
            best.add(start, q @ d.T)  # (queries, chunk): cosine
        return best.merged()
