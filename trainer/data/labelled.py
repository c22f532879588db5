"""Labelled (query, document) pairs, so that an in-batch document labelled relevant to a query is not
scored as that query's negative.

On data with many positives per query (NFCorpus: 43 on average, up to 1,363), another row's positive in
the same batch is often a labelled positive of this row's query too, and plain in-batch contrastive
training pushes it away. With ``loss.mask_labelled_positives`` such documents leave the query's softmax
(its own positive stays). Texts are identified by a 64-bit hash of their bytes, so a copy of a document
under another id is the same document, and the mask depends only on the pairs: the same on any split
of the batch over ranks.
"""

from __future__ import annotations

import hashlib

import torch

from trainer.data.rows import Rows

__all__ = ["labelled_mask", "labelled_pairs", "text_key"]


def text_key(text: str) -> int:
    """A stable signed 64-bit key of ``text`` (a tensor's int64).

    >>> text_key("a") == text_key("a") != text_key("b")
    True
    """
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def labelled_pairs(rows: Rows) -> frozenset[tuple[int, int]]:
    """(query key, positive key) of every row of a (query, positive, ...) source."""
    queries, documents, _ = rows.all()
    return frozenset((text_key(q), text_key(docs[0])) for q, docs in zip(queries, documents))


def labelled_mask(
    query_keys: list[int], document_keys: list[int], labelled: frozenset[tuple[int, int]], own: list[int]
) -> torch.Tensor:
    """``(queries, documents)``: True where the document is a labelled positive of the query, other than
    the query's own positive column ``own[i]``.

    >>> pairs = frozenset({(1, 10), (1, 11), (2, 11)})
    >>> labelled_mask([1, 2], [10, 99, 11, 98], pairs, own=[0, 2]).tolist()
    [[False, False, True, False], [False, False, False, False]]
    """
    mask = torch.tensor([[(q, d) in labelled for d in document_keys] for q in query_keys], dtype=torch.bool)
    mask[torch.arange(len(query_keys)), torch.tensor(own, dtype=torch.long)] = False
    return mask
