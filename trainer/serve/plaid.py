"""The job's PLAID index held in memory for serving: ``trainer/retrieval/plaid.py``'s :class:`PlaidSearch` over
the index phase's index, its document ids read once.

The ids are the index phase's ``corpus-ids.json`` (the document of each PLAID id, 0, 1, ...); an index built
before the phase wrote it falls back to the mapping PyLate saved beside it, read once here. The count is checked
against fast-plaid's ``metadata.json``. A batch of concurrent queries is searched on the server's torch threads
(``OMP_NUM_THREADS``) at once.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainer.retrieval.plaid import FAST_PLAID_DIR, IdsMismatch, PlaidSearch
from trainer.serve import ServeError
from trainer.serve.corpus import IDS

__all__ = ["INDEX_NAME", "PlaidIndex", "document_ids"]

INDEX_NAME = "colbert"  # trainer/index.py's
_PYLATE_IDS = "plaid_ids_to_documents_ids.pkl"  # PyLate's mapping, beside fast-plaid's folder


def document_ids(index_dir: Path) -> list[str]:
    """The document id of each PLAID id, in order."""
    if (index_dir / IDS).is_file():
        return [str(i) for i in json.loads((index_dir / IDS).read_text())]
    import pickle  # an index from before corpus-ids.json: PyLate's mapping, covered by the index's manifest

    mapping = pickle.loads((index_dir / INDEX_NAME / _PYLATE_IDS).read_bytes())
    if sorted(mapping) != list(range(len(mapping))):
        raise ServeError(f"{index_dir / INDEX_NAME / _PYLATE_IDS} does not number the documents 0..n-1; build again")
    return [str(mapping[i]) for i in range(len(mapping))]


class PlaidIndex(PlaidSearch):
    """The PLAID index under a job's ``index/``, searchable (:meth:`PlaidSearch.search`)."""

    def __init__(self, index_dir: Path, device: str, threads: int = 1):
        try:
            super().__init__(index_dir / INDEX_NAME / FAST_PLAID_DIR, document_ids(index_dir), device, threads)
        except IdsMismatch as e:
            raise ServeError(f"{index_dir}: {e}; build the index again") from None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ServeError(f"{index_dir} is not a PLAID index of this trainer ({type(e).__name__}: {e})") from None
