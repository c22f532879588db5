"""What kind a model directory is, as the three readers of it see it: the base-model evaluation
(``baseline.base_kind``), the distillation teacher (``teacher.teacher_kind``) and the projection start
(``projection.has_projection``), all through ``trainer/model_kind.py``."""

from __future__ import annotations

import json

import pytest

from trainer.baseline import base_kind
from trainer.projection import has_projection
from trainer.teacher import TeacherError, teacher_kind

TRANSFORMER = {"type": "sentence_transformers.models.Transformer"}
POOLING = {"type": "sentence_transformers.models.Pooling"}
ST_DENSE = {"type": "sentence_transformers.models.Dense"}
PYLATE_DENSE = {"type": "pylate.models.Dense.Dense"}
BERT = {"architectures": ["BertModel"], "hidden_size": 32}
RERANKER = {"architectures": ["BertForSequenceClassification"], "id2label": {"0": "LABEL_0"}}
NLI = {"architectures": ["BertForSequenceClassification"], "id2label": {"0": "a", "1": "b", "2": "c"}}

# name, modules.json (None: absent; a str: written as is), config.json, base_kind, teacher_kind (or refusal), Dense
CASES = [
    ("pylate colbert", [TRANSFORMER, PYLATE_DENSE], BERT, "colbert", "colbert", True),
    ("bi-encoder", [TRANSFORMER, POOLING], BERT, "bi-encoder", "bi-encoder", False),
    ("bi-encoder with a dense layer", [TRANSFORMER, POOLING, ST_DENSE], BERT, "bi-encoder", "bi-encoder", True),
    ("cross-encoder", None, RERANKER, None, "cross-encoder", False),
    ("cross-encoder with three logits", None, NLI, None, "gives 3 logits per pair", False),
    ("bare encoder", None, BERT, None, "found: BertModel", False),
    ("empty directory", None, None, None, "found: no architectures in config.json", False),
    ("modules.json not json", "{", BERT, None, "found: BertModel", False),
    ("modules.json not a list", '{"type": "pylate"}', BERT, None, "found: BertModel", False),
]


@pytest.mark.parametrize("modules, config, base, teacher, dense", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_reader_sees_the_kind_the_files_say(tmp_path, modules, config, base, teacher, dense):
    if modules is not None:
        (tmp_path / "modules.json").write_text(modules if isinstance(modules, str) else json.dumps(modules))
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
    path = str(tmp_path)
    assert base_kind(path) == base
    assert has_projection(path) is dense
    if teacher in ("colbert", "bi-encoder", "cross-encoder"):
        assert teacher_kind(path) == teacher
    else:
        with pytest.raises(TeacherError) as e:
            teacher_kind(path)
        assert teacher in str(e.value) and "\n" not in str(e.value)


def test_a_saved_pylate_model_is_a_colbert_to_every_reader(tmp_path, tiny_model):
    """The files PyLate itself writes, not a hand-written stand-in."""
    from trainer.config.schema import ModelConfig
    from trainer.model import build_model

    colbert = tmp_path / "colbert"
    build_model(ModelConfig(name_or_path=str(tiny_model), embedding_size=8), "cpu").save(str(colbert))
    assert (base_kind(str(colbert)), teacher_kind(str(colbert)), has_projection(str(colbert))) == (
        "colbert",
        "colbert",
        True,
    )
    assert (base_kind(str(tiny_model)), has_projection(str(tiny_model))) == (None, False)
