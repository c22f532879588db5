"""Exact MaxSim with the ColBERT being trained: the reference every other ColBERT search is measured against."""

from __future__ import annotations

import torch
from tqdm import tqdm

from trainer.encode import embed_texts
from trainer.retrieval.search import DOC_CHUNK, Candidates, TopK, my_chunks

__all__ = ["QUERY_BLOCK", "ModelRetriever", "maxsim", "own_columns", "scoring_width"]

QUERY_BLOCK = 64  # queries scored at once against a document chunk


def own_columns(documents: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``documents`` ``(documents, tokens, dim)`` with each masked column (padding, skipped punctuation) replaced
    by the document's first scoring vector, so PyLate's ``colbert_scores`` needs no mask.

    PyLate multiplies a masked similarity by 0: a query token whose best similarity in a document is negative
    would score 0 there, and a document's score would depend on the documents padded beside it. A copy of one of
    its own vectors changes no maximum. A document with no scoring column becomes zeros (scores 0, as before).

    >>> d = torch.tensor([[[1.0, 0.0], [9.0, 9.0], [0.0, 1.0]], [[5.0, 5.0], [5.0, 5.0], [5.0, 5.0]]])
    >>> own_columns(d, torch.tensor([[True, False, True], [False, False, False]])).tolist()
    [[[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]]
    """
    mask = mask.bool()
    first = mask.int().argmax(1)  # each document's first scoring column (0 where it has none)
    fill = documents[torch.arange(len(documents)), first] * mask.any(1, keepdim=True)
    return torch.where(mask[..., None], documents, fill[:, None, :])


def maxsim(queries: torch.Tensor, documents: list[torch.Tensor]) -> torch.Tensor:
    """PyLate's ``colbert_scores`` of ``queries`` ``(queries, tokens, dim)`` against documents of their own
    lengths (each ``(tokens, dim)``): ``(queries, documents)``, each score the document's own MaxSim
    (:func:`own_columns`).

    >>> q = torch.tensor([[[1.0, 0.0]]])
    >>> maxsim(q, [torch.tensor([[-1.0, 0.0]]), torch.tensor([[0.0, 1.0], [0.5, 0.5]])]).tolist()
    [[-1.0, 0.5]]
    """
    from pylate.scores import colbert_scores

    padded = torch.nn.utils.rnn.pad_sequence(documents, batch_first=True).to(queries)  # zeros past each one's end
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones(len(d), dtype=torch.bool) for d in documents], batch_first=True)
    return colbert_scores(queries, own_columns(padded, mask))


def scoring_width(mask: torch.Tensor) -> int:
    """Columns up to the last one any document scores with: trimming there changes no MaxSim.

    Not the largest *count* of scoring tokens: the mask drops punctuation inside a document, so a
    document's last scoring token can sit past that count.

    >>> scoring_width(torch.tensor([[1, 0, 1, 0], [1, 1, 0, 0]], dtype=torch.bool))
    3
    >>> scoring_width(torch.zeros(2, 4, dtype=torch.bool))
    1
    """
    columns = mask.any(0).nonzero()
    return int(columns.max()) + 1 if len(columns) else 1


class ModelRetriever:
    """Exact MaxSim of the model being trained: mining's retriever and evaluation's search. The corpus is
    cut into fixed chunks of ``DOC_CHUNK`` documents, dealt round-robin to the ranks; each rank scores every
    query against its chunks, and the per-rank lists are merged.

    ``stored=True`` (mining: many searches, one per part of the queries) encodes each chunk once, kept in
    fp16 and trimmed to the chunk's longest document; ``stored=False`` (evaluation: one search) encodes each
    chunk as it is scored, in float32, so memory is bounded by a chunk, not the corpus.

    Every chunk is encoded and scored with the same shapes on any world size, and ties go to the
    lower document index, so the mined rows are the same bytes on 1 rank or 64. ``on_chunk`` is called
    after each chunk this rank encoded (the job's progress).

    A chunk is ``(first document, embeddings, mask)``, its embeddings passed through :func:`own_columns`, so each
    score is the document's own MaxSim."""

    @classmethod
    def build(cls, model, corpus, mcfg, show, device, on_chunk, **_) -> ModelRetriever:
        return cls(model, corpus, mcfg.batch_size, device, show, on_chunk)

    def __init__(
        self, model, corpus: list[str], batch_size: int, device, show: bool, on_chunk=lambda: None, stored=True
    ):
        self.model, self.corpus, self.batch_size, self.device = model, corpus, batch_size, device
        self.chunks: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        self.stored = stored
        if not stored:
            return
        model.eval()
        for start in tqdm(my_chunks(len(corpus)), desc="mine: encode corpus", disable=not show, unit="chunk"):
            emb, mask = self._encode(start)
            self.chunks.append((start, emb.half(), mask))
            on_chunk()

    def _encode(self, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The chunk from ``start``, trimmed where no document scores any more (no MaxSim changes)."""
        texts = self.corpus[start : start + DOC_CHUNK]
        emb, mask = embed_texts(self.model, texts, False, self.batch_size, self.model.document_length, self.device)
        width = scoring_width(mask)
        return own_columns(emb[:, :width], mask[:, :width]), mask[:, :width]

    def _chunks(self):
        if self.stored:
            yield from self.chunks
        else:
            for start in my_chunks(len(self.corpus)):
                yield (start, *self._encode(start))

    @torch.no_grad()
    def search(self, queries: list[str], positives: list[set[int]], k: int) -> tuple[list[Candidates], list[dict]]:
        return self.search_embedded(self.embed_queries(queries), positives, k)

    @torch.no_grad()
    def embed_queries(self, queries: list[str]) -> torch.Tensor:
        """The queries' embeddings ``(queries, query_length, dim)``, float32: what :meth:`search_embedded` scores
        (the predictor encodes one batch while it searches the one before)."""
        return embed_texts(self.model, queries, True, self.batch_size, self.model.query_length, self.device)[0]

    @torch.no_grad()
    def search_embedded(
        self, q_emb: torch.Tensor, positives: list[set[int]], k: int
    ) -> tuple[list[Candidates], list[dict]]:
        """:meth:`search` of queries already embedded by :meth:`embed_queries`."""
        from pylate.scores import colbert_scores

        best = TopK(positives, k + max(len(p) for p in positives))  # the positives may take places in the top-k
        for start, d_emb, _ in self._chunks():
            d = d_emb.float()  # masked columns hold a copy of a scoring one (own_columns): no mask needed
            blocks = range(0, len(q_emb), QUERY_BLOCK)
            scores = [colbert_scores(q_emb[i : i + QUERY_BLOCK], d) for i in blocks]
            best.add(start, torch.cat(scores).cpu())
        return best.merged()
