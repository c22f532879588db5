"""What kind of model a directory (or a Hub model in the local cache) holds, read from its files, never loaded.

sentence-transformers lists a model's modules in ``modules.json``: a PyLate module there makes a ColBERT, a
Pooling module a bi-encoder. A transformers ``config.json`` whose architecture is ``*ForSequenceClassification``
(and no PyLate module) is a cross-encoder: sentence-transformers' ``CrossEncoder`` writes no ``modules.json``.
Anything else, or files not at hand without a download, is of no kind here (None): each caller says what that
means for it (the base-model evaluation skips it, the teacher refuses it).

>>> import json, tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> _ = (root / "modules.json").write_text(json.dumps([{"type": "pylate.models.Dense.Dense"}]))
>>> model_kind(str(root)), module_types(str(root))
('colbert', ['pylate.models.Dense.Dense'])
>>> model_kind(str(root / "nowhere")), module_types(str(root / "nowhere")), model_config(str(root))
(None, [], {})
"""

from __future__ import annotations

import json
from typing import Literal

from trainer.storage.card import model_file

__all__ = ["Kind", "colbert_config", "model_config", "model_kind", "module_types"]

Kind = Literal["colbert", "cross-encoder", "bi-encoder"]


def _json(name_or_path: str, filename: str):
    """``filename`` of the model parsed, where it is at hand; None where it is not, or is not JSON."""
    found = model_file(name_or_path, filename)
    try:
        return json.loads(found.read_text()) if found else None
    except (OSError, ValueError):
        return None


def module_types(name_or_path: str) -> list[str]:
    """The ``type`` of each module in the model's ``modules.json`` (empty where there is none to read)."""
    modules = _json(name_or_path, "modules.json")
    if not isinstance(modules, list):
        return []
    return [str(m.get("type", "")) for m in modules if isinstance(m, dict)]


def model_config(name_or_path: str) -> dict:
    """The model's transformers ``config.json`` (empty where there is none to read)."""
    config = _json(name_or_path, "config.json")
    return config if isinstance(config, dict) else {}


def colbert_config(name_or_path: str) -> dict:
    """A PyLate model's ``config_sentence_transformers.json`` (its lengths, prefixes; empty where none)."""
    config = _json(name_or_path, "config_sentence_transformers.json")
    return config if isinstance(config, dict) else {}


def model_kind(name_or_path: str) -> Kind | None:
    """``colbert``, ``cross-encoder``, ``bi-encoder``, or None (neither, or not at hand without a download)."""
    types = module_types(name_or_path)
    if any(t.startswith("pylate") for t in types):
        return "colbert"
    architectures = model_config(name_or_path).get("architectures") or []
    if any(str(a).endswith("ForSequenceClassification") for a in architectures):
        return "cross-encoder"
    if any(t.endswith("Pooling") for t in types):
        return "bi-encoder"
    return None
