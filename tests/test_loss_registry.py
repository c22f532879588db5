"""The loss registry (``trainer/losses/__init__.py``): the config's choices, the refusal of an unknown name, and
every rule that depends on a loss reading teacher scores asks the registry (``scored``), never the name. No
torch: the registry and the config are what the CLI imports."""

from __future__ import annotations

import pytest

from trainer.config.load import parse_config
from trainer.config.schema import TrainConfig, json_schema
from trainer.losses import LOSSES, build_loss, loss_named
from trainer.losses.loss import Loss
from trainer.losses.sections import ContrastiveLoss, DistillationLoss
from trainer.scale import job_scale, micro_batches

BASE = {"data": {"train": {"path": "t"}}, "training": {"max_steps": 1}}


def test_the_configs_choices_are_the_registrys():
    """The schema the chart embeds lists exactly the registered sections, by their keys."""
    mapping = json_schema()["properties"]["loss"]["discriminator"]["mapping"]
    assert set(mapping) == set(LOSSES)
    for key, section in LOSSES.items():
        assert issubclass(section, Loss) and section.key() == key
        assert mapping[key].endswith(f"/{section.__name__}")


def test_an_unknown_loss_is_refused_in_one_line_never_read_as_another():
    with pytest.raises(ValueError, match=r"^unknown loss 'focal': use one of contrastive, cached-contrastive, "):
        loss_named("focal")

    class Focal(DistillationLoss):  # a section the registry does not hold, under a name it does not know
        name: str = "focal"

    with pytest.raises(ValueError, match="unknown loss 'focal'"):
        build_loss(Focal.model_construct(name="focal"), gather=False)
    with pytest.raises(Exception, match="loss.name|'focal'"):
        parse_config({**BASE, "loss": {"name": "focal"}})


def test_every_scored_rule_asks_the_registry(monkeypatch):
    """Flip ``scored`` on the registered sections and each rule follows: what the config refuses, how a global
    batch splits, how many in-batch negatives a query sees, which rows the trainer reads. A rule that compared
    the name with "distillation" would not move."""
    distill = {**BASE, "loss": {"name": "distillation"}}
    teacher = {"mine": {"teacher": {"name_or_path": "x"}}}
    assert parse_config({**distill, **teacher}).loss.scored
    with pytest.raises(Exception, match="set it, or remove mine.teacher"):
        parse_config({**BASE, **teacher})
    elastic = {**BASE, "training": {"max_steps": 1, "global_batch_size": 8, "per_device_batch_size": 2}}
    cfg = parse_config({**elastic, "loss": {"name": "distillation"}})
    assert micro_batches(cfg, 2) == (2, 2) and job_scale(cfg, 2).negatives_per_query == 0

    monkeypatch.setattr(DistillationLoss, "scored", False)
    monkeypatch.setattr(ContrastiveLoss, "scored", True)
    with pytest.raises(Exception, match="set it, or remove mine.teacher"):
        parse_config({**distill, **teacher})
    assert parse_config({**BASE, **teacher}).loss.name == "contrastive"
    assert micro_batches(cfg, 2) == (4, 1) and job_scale(cfg, 2).negatives_per_query > 0
    assert isinstance(TrainConfig.model_validate(BASE).loss, ContrastiveLoss)
