"""The speed switches HF Trainer users expect (issue 34): each gives the same mathematics on CPU as the
plain path, and one that cannot run here is one line.

* ``model.attn_implementation``: sdpa against eager, the same losses;
* ``training.compile``: the compiled encoder against the eager one, the same losses;
* flash_attention_2 without a GPU or without its package: refused before the model loads.
"""

from __future__ import annotations

import pytest
import torch

from trainer.config.load import parse_config
from trainer.config.schema import ConfigError, ModelConfig
from trainer.model import build_model, check_attention

TEXTS = ["sorting a list in place", "open a file for reading", "parse a JSON document", "zip two iterables"]


def _loss(model) -> float:
    """The contrastive loss of a fixed batch (queries against the texts as documents), no dropout."""
    from trainer.encode import encode
    from trainer.losses import contrastive_from_embeddings

    model.eval()
    q = encode(model, model.tokenize(TEXTS, is_query=True), True, model.query_length)
    d = encode(model, model.tokenize(TEXTS, is_query=False), False, model.document_length)
    docs = d.embeddings.unsqueeze(1)
    return float(contrastive_from_embeddings(q.embeddings, docs, d.mask.unsqueeze(1), 1.0, False))


def _model(path, **kw):
    torch.manual_seed(0)  # the same new projection
    return build_model(ModelConfig(name_or_path=str(path), query_length=16, document_length=32, **kw), "cpu")


def test_sdpa_attention_gives_the_losses_of_eager_attention(tiny_model_no_dropout):
    eager = _model(tiny_model_no_dropout, attn_implementation="eager")
    sdpa = _model(tiny_model_no_dropout, attn_implementation="sdpa")
    assert eager[0].auto_model.config._attn_implementation == "eager"
    assert sdpa[0].auto_model.config._attn_implementation == "sdpa"
    assert _loss(sdpa) == pytest.approx(_loss(eager), abs=1e-5)


@pytest.mark.slow
def test_a_compiled_encoder_gives_the_losses_of_the_eager_one(tiny_model_no_dropout):
    plain, compiled = _model(tiny_model_no_dropout), _model(tiny_model_no_dropout)
    compiled[0].auto_model.compile()  # what training.compile does
    assert _loss(compiled) == pytest.approx(_loss(plain), abs=1e-5)
    assert set(compiled.state_dict()) == set(plain.state_dict())  # checkpoints keep their names


def test_flash_attention_where_it_cannot_run_is_one_line():
    with pytest.raises(ConfigError, match="flash_attention_2 needs a CUDA GPU; use sdpa on CPU"):
        check_attention("flash_attention_2", torch.device("cpu"))
    import importlib.util

    if importlib.util.find_spec("flash_attn") is None:
        with pytest.raises(ConfigError, match="needs the flash-attn package"):
            check_attention("flash_attention_2", torch.device("cuda"))
    check_attention("sdpa", torch.device("cpu"))  # nothing to refuse


def test_the_speed_keys_are_config_keys_with_safe_defaults():
    cfg = parse_config({"data": {"train": {"path": "t"}}, "training": {"max_steps": 1}})
    assert (cfg.training.compile, cfg.training.tf32, cfg.model.attn_implementation) == (False, True, None)
    with pytest.raises(ConfigError, match="model.attn_implementation"):
        parse_config(
            {
                "data": {"train": {"path": "t"}},
                "training": {"max_steps": 1},
                "model": {"attn_implementation": "xformers"},
            }
        )
