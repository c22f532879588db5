"""Training data: rows (one Arrow file per source, ``rows.py``) and batches (the (seed, step)
schedule, ``batches.py``)."""

from trainer.data.batches import Batch, StreamingData, TokenizedData, batches
from trainer.data.rows import ROWS_PER_BATCH, DataError, Rows, document_text, iter_jsonl, load_rows, locked, text_field

__all__ = [
    "DataError",
    "Rows",
    "load_rows",
    "locked",
    "iter_jsonl",
    "text_field",
    "document_text",
    "ROWS_PER_BATCH",
    "Batch",
    "StreamingData",
    "TokenizedData",
    "batches",
]
