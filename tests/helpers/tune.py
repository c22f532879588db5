"""A sweep's ``--config`` as the ``tune`` tests write it: one text, each test file choosing its training section."""

from __future__ import annotations

_HEAD = """\
model: {name_or_path: sentence-transformers/all-MiniLM-L6-v2}
data:
  train: {path: data/train.jsonl}
  eval_beir: data/beir
  eval_split: dev
mine: {retriever: bm25, negatives: 1}
"""


def sweep_config(training: str, *sections: str) -> str:
    """BM25 mining (no model to stage for it), a dev split to choose the best trial on, ``training`` and the
    ``sections`` (one YAML line each) as given, the quickstart's output directory.

    >>> print(sweep_config("{max_steps: 4}", "evaluation: {every_steps: 1}").splitlines()[-3:])
    ['training: {max_steps: 4}', 'evaluation: {every_steps: 1}', 'output_dir: output/quickstart']
    """
    return _HEAD + f"training: {training}\n" + "".join(f"{s}\n" for s in sections) + "output_dir: output/quickstart\n"
