"""Shared fixtures: a tiny BERT built from a config (no download), with and without dropout. The helpers
the tests share are in ``tests/helpers/``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import make_tiny_bert

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# scripts the tests start under torchrun: importing one runs it, so the doctest collection leaves them out
collect_ignore = ["scripts"]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_model_no_dropout(tmp_path_factory) -> Path:
    """For split-equivalence tests only (W x b vs 1 x Wb, accumulation): same mathematics, no masks."""
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert-p0"), dropout=0.0)
