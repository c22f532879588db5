"""model.projection_init: a new projection started from the encoder's own principal directions, checked
against numpy's SVD of the same token embeddings; and the two inputs it refuses, in one line each."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.helpers import write_triplets
from trainer.cli import stage
from trainer.config.schema import ConfigError, ModelConfig, TrainConfig
from trainer.env import Layout
from trainer.model import build_model
from trainer.train import build

CPU = torch.device("cpu")


def _config(model, data, tmp_path, **model_keys) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "model": {"name_or_path": str(model), "query_length": 16, "document_length": 32, **model_keys},
            "data": {"train": {"path": str(data)}, "cache_dir": str(tmp_path / "cache")},
            "training": {"per_device_batch_size": 4, "max_steps": 1, "seed": 3},
        }
    )


def _token_matrix(model, documents: list[str]) -> np.ndarray:
    """The encoder's token embeddings of ``documents``, padding left out: the plain reference's input."""
    model.eval()
    with torch.no_grad():
        out = model[0](model.tokenize(documents, is_query=False))
    return out["token_embeddings"][out["attention_mask"].bool()].double().numpy()


def test_a_principal_projection_spans_the_top_singular_directions_of_the_token_embeddings(tiny_model, tmp_path):
    """The trainer's new projection (8 of the tiny encoder's 32 directions) equals numpy's top-8 right singular
    vectors of the token embeddings of the training documents, up to each row's sign; at random it does not."""
    data = write_triplets(tmp_path / "t.jsonl", 12)
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    documents = list(dict.fromkeys(d for r in rows for d in (r["positive"], r["negative"])))

    principal = build(_config(tiny_model, data, tmp_path, embedding_size=8, projection_init="principal"), Layout(), CPU)
    weight = principal.model[1].linear.weight.detach().double().numpy()
    _, _, vt = np.linalg.svd(
        _token_matrix(build_model(ModelConfig(name_or_path=str(tiny_model), document_length=32), "cpu"), documents)
    )
    overlap = np.abs(weight @ vt[:8].T)  # rows are unit vectors: |cosine| per pair
    np.testing.assert_allclose(overlap, np.eye(8), atol=1e-4)

    plain = build(_config(tiny_model, data, tmp_path, embedding_size=8), Layout(), CPU)
    assert not np.allclose(
        np.abs(plain.model[1].linear.weight.detach().double().numpy() @ vt[:8].T), np.eye(8), atol=0.1
    )


def test_principal_refuses_a_model_that_has_its_own_projection_and_a_projection_wider_than_the_encoder(
    tiny_model, tmp_path
):
    data = write_triplets(tmp_path / "t.jsonl", 4)
    colbert = tmp_path / "colbert"
    build_model(ModelConfig(name_or_path=str(tiny_model), embedding_size=8), "cpu").save(str(colbert))
    with pytest.raises(ConfigError, match="already has one; leave model.projection_init at random"):
        build(_config(colbert, data, tmp_path, projection_init="principal"), Layout(), CPU)
    with pytest.raises(ConfigError, match="already has one"):  # the job's staging says so before any mining
        stage(_config(colbert, data, tmp_path, projection_init="principal"))
    with pytest.raises(ConfigError, match="set model.embedding_size to 32 or less"):
        build(_config(tiny_model, data, tmp_path, embedding_size=64, projection_init="principal"), Layout(), CPU)
    with pytest.raises(ConfigError, match="keeps 64 of the encoder's 32 directions"):  # read from config.json
        stage(_config(tiny_model, data, tmp_path, embedding_size=64, projection_init="principal"))
    with pytest.raises(ConfigError, match="keeps 128 of the encoder's 32"):  # unset: PyLate's 128
        stage(_config(tiny_model, data, tmp_path, projection_init="principal"))
    stage(_config(tiny_model, data, tmp_path, embedding_size=32, projection_init="principal"))  # as wide: kept
