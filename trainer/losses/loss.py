"""What a loss is, for the config and the training loop: :class:`Loss`, the config section every loss is.

Standard library and pydantic only (the CLI validates configs without torch): a section says its key
(``name``), what it reads (:attr:`Loss.scored`) and builds its objective (:meth:`Loss.build`), importing the
torch module that computes it only then (by name, as the retrievers are: the config never imports torch, and
the objective's modules, which read the config's types, import nothing back).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, ClassVar, get_args

from trainer.config.base import Strict

__all__ = ["Loss", "Objective"]

Objective = Callable[[Any, Any], Any]
"""``(model, batch) -> LossOutput`` (``trainer/losses/base.py``): what the training loop calls each micro-batch."""


class Loss(Strict):
    """A loss's config section. A subclass declares ``name: Literal["<key>"]``, its own fields and
    :meth:`build`; :data:`trainer.losses.LOSSES` lists it by that key."""

    name: str
    scored: ClassVar[bool] = False
    """True: each row is a query's candidates with teacher scores (``documents``, ``scores``) and the loss is
    computed per row, so it draws no in-batch negatives and micro-batches accumulate exactly. False: (query,
    positive, negatives) rows, in-batch negatives drawn from one micro-batch."""

    objective: ClassVar[str]
    """``module:Class`` under ``trainer.losses``: the torch objective :meth:`build` makes."""

    @classmethod
    def key(cls) -> str:
        """The ``loss.name`` that selects this section: the one value its ``name`` field admits."""
        return get_args(cls.model_fields["name"].annotation)[0]

    def build(self, gather: bool) -> Objective:
        """The objective, with cross-rank negatives when ``gather``."""
        module, name = self.objective.split(":")
        return getattr(importlib.import_module(f"trainer.losses.{module}"), name)(**self.arguments(gather))

    def arguments(self, gather: bool) -> dict[str, Any]:
        """The objective's constructor arguments, from this section and the run."""
        raise NotImplementedError
