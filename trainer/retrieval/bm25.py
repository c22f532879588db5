"""BM25 (the ``bm25s`` library): no model, the queries dealt to the ranks."""

from __future__ import annotations

import torch

from trainer import distributed as D
from trainer.retrieval.search import Candidates

__all__ = ["Bm25Retriever"]


class Bm25Retriever:
    """BM25 (the ``bm25s`` library) over the whole corpus on every rank; each rank answers every
    world-size-th query and the answers are gathered. Only documents sharing a word with the query
    (score > 0) are candidates, so a query that matches few documents gets a short list."""

    @classmethod
    def build(cls, corpus, show, **_) -> Bm25Retriever:
        return cls(corpus, show)

    def __init__(self, corpus: list[str], show: bool):
        import bm25s

        self.bm25s = bm25s
        self.index = bm25s.BM25()
        self.index.index(bm25s.tokenize(corpus, stopwords="en", show_progress=show), show_progress=show)

    def search(
        self, queries: list[str], positives: list[set[int]], k: int
    ) -> tuple[list[Candidates | None], list[dict]]:
        """None for a query with no word BM25 can search for."""
        rank, world = D.rank(), D.world_size()
        mine = list(range(rank, len(queries), world))
        tokens = self.bm25s.tokenize([queries[i] for i in mine], stopwords="en", return_ids=False, show_progress=False)
        answers = []
        for qi, words in zip(mine, tokens):
            if not words:  # stopwords, punctuation, one-letter words: nothing to rank by (bm25s raises IndexError)
                answers.append((qi, None, {}))
                continue
            scores = torch.from_numpy(self.index.get_scores(words))
            top = scores.sort(descending=True, stable=True)  # ties go to the lower index
            keep = k + len(positives[qi])
            # a document scored 0 shares no word with the query: BM25 knows nothing of it, so it is no candidate
            cands = [(int(i), float(v)) for v, i in zip(top.values[:keep], top.indices[:keep]) if v > 0]
            answers.append((qi, cands, {p: float(scores[p]) for p in positives[qi]}))
        merged = sorted((a for part in D.gather_objects(answers) for a in part), key=lambda a: a[0])
        return [a[1] for a in merged], [a[2] for a in merged]
