"""The job's PLAID index held in memory for serving: fast-plaid's own index, its document ids loaded once.

Searching through PyLate's ``indexes.PLAID`` reads its two id mappings (pickles) from disk on every call, which
at a few hundred documents costs more than the search itself. :class:`PlaidIndex` loads the same index with
fast-plaid's public ``search.FastPlaid`` (what PyLate wraps), reads the document ids once, and searches with
PyLate's own defaults, so a served top-k is the index phase's (``trainer/index.py``) id for id.

The ids are the index phase's ``corpus-ids.json`` (the document of each PLAID id, 0, 1, ...); an index built
before the phase wrote it falls back to the mapping PyLate saved beside it, read once here. The count is checked
against fast-plaid's ``metadata.json``.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from trainer.serve import ServeError
from trainer.serve.corpus import IDS

__all__ = ["INDEX_NAME", "PlaidIndex", "document_ids"]

INDEX_NAME = "colbert"  # trainer/index.py's
_PYLATE_IDS = "plaid_ids_to_documents_ids.pkl"  # PyLate's mapping, beside fast-plaid's folder


def _pylate_defaults() -> dict:
    """The search settings PyLate's ``PLAID`` passes to fast-plaid by default (the index phase's)."""
    from pylate.indexes import PLAID

    given = inspect.signature(PLAID).parameters
    return {
        "batch_size": given["batch_size"].default,
        "n_full_scores": given["n_full_scores"].default,
        "n_ivf_probe": given["n_ivf_probe"].default,
        "n_processes": given["num_threads"].default,
        "low_memory": given["low_memory"].default,
    }


def document_ids(index_dir: Path) -> list[str]:
    """The document id of each PLAID id, in order."""
    if (index_dir / IDS).is_file():
        return [str(i) for i in json.loads((index_dir / IDS).read_text())]
    import pickle  # an index from before corpus-ids.json: PyLate's mapping, covered by the index's manifest

    mapping = pickle.loads((index_dir / INDEX_NAME / _PYLATE_IDS).read_bytes())
    if sorted(mapping) != list(range(len(mapping))):
        raise ServeError(f"{index_dir / INDEX_NAME / _PYLATE_IDS} does not number the documents 0..n-1; build again")
    return [str(mapping[i]) for i in range(len(mapping))]


class PlaidIndex:
    """A PLAID index in memory: ``search`` reads no file (fast-plaid stats its ``metadata.json`` to notice a
    rebuilt index, and reads nothing unless it changed)."""

    def __init__(self, index_dir: Path, device: str):
        from fast_plaid import search

        folder = index_dir / INDEX_NAME / "fast_plaid_index"
        try:
            self.ids = document_ids(index_dir)
            held = json.loads((folder / "metadata.json").read_text())["num_documents"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ServeError(f"{index_dir} is not a PLAID index of this trainer ({type(e).__name__}: {e})") from None
        if held != len(self.ids):
            raise ServeError(
                f"{index_dir}: the PLAID index holds {held} documents, its ids {len(self.ids)}; build the index again"
            )
        settings = _pylate_defaults()
        self._fast = search.FastPlaid(index=str(folder), device=device, low_memory=settings.pop("low_memory"))
        self._settings = settings

    def search(self, queries_embeddings: list, k: int) -> list[list[tuple[str, float]]]:
        """The top ``k`` (document id, PLAID score) of each query, best first; a query is its token embeddings
        (tokens, dim), as PyLate's ``encode`` gives them."""
        import torch

        found = self._fast.search(
            queries_embeddings=[torch.as_tensor(q) for q in queries_embeddings],
            top_k=k,
            show_progress=False,
            **self._settings,
        )
        return [[(self.ids[p], float(s)) for p, s in hits if 0 <= p < len(self.ids)] for hits in found]
