"""Training data: rows (one Arrow file per source, ``rows.py``) and batches (the (seed, step) schedule,
``batches.py``).

The package's face is the rows' names only: they load no torch, so a module that needs :class:`DataError` or
the row readers (the trainer's CLI, evaluation, the CLI's checks) stays light. The batch names
(``Batch``, ``StreamingData``, ``TokenizedData``, ``batches``) need torch: import them from
``trainer.data.batches``."""

from trainer.data.rows import ROWS_PER_BATCH, DataError, Rows, document_text, iter_jsonl, load_rows, locked, text_field

__all__ = ["DataError", "Rows", "load_rows", "locked", "iter_jsonl", "text_field", "document_text", "ROWS_PER_BATCH"]
