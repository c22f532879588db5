"""A search space: ``--param KEY=SPACE``, one config key and the values a sweep may give it.

    training.learning_rate=loguniform(1e-5,2e-4)   a float, its logarithm uniform between the bounds
    training.warmup_ratio=uniform(0,0.2)           a float, uniform between the bounds
    training.max_steps=int(48,480)                 an integer, uniform between the bounds (both included)
    mine.negatives=choice(1,3)                     one of the values (any YAML scalars: 1, 3e-5, cosine)

A value is read as the config's YAML reads it (:func:`trainer.config.overrides.parse_value`). Sampling is a pure
function of the seed and the trial's index, so a resumed sweep draws the same trials; drawn floats keep three
significant digits, so a trial's table row is its exact value.

>>> s = parse_space("training.learning_rate=loguniform(1e-5,2e-4)"); s.text
'loguniform(1e-05, 0.0002)'
>>> 1e-5 <= s.sample(random.Random(0)) <= 2e-4
True
>>> parse_space("mine.negatives=choice(1,3)").grid()
(1, 3)
>>> points = grid_points([parse_space("a.b=int(1,1000000000)"), parse_space("c=choice(x,y)")])
>>> next(points), next(points), next(points)
({'a.b': 1, 'c': 'x'}, {'a.b': 1, 'c': 'y'}, {'a.b': 2, 'c': 'x'})
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from operator_cli.errors import CliError

__all__ = ["KINDS", "Space", "grid_points", "parse_space"]

KINDS = ("loguniform", "uniform", "int", "choice")
_SPACE = re.compile(r"\s*([a-z]+)\s*\((.*)\)\s*", re.S)


@dataclass(frozen=True)
class Space:
    """One ``--param``: a config key and its values (a range, or ``choices``)."""

    key: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    choices: tuple[Any, ...] = ()

    @property
    def text(self) -> str:
        """As a user writes it (the card and ``tune status`` show it)."""
        if self.kind == "choice":
            return f"choice({', '.join(_shown(v) for v in self.choices)})"
        return f"{self.kind}({_shown(self.low)}, {_shown(self.high)})"

    @property
    def name(self) -> str:
        """The parameter's name in an Experiment or OptimizationJob: the key with ``_`` for ``.`` (a Go template
        field and a Katib trial parameter both take it)."""
        return self.key.replace(".", "_")

    def edges(self) -> list[Any]:
        """The values the config schema must accept for the whole space to be valid: the bounds, or each choice."""
        return list(self.choices) if self.kind == "choice" else [self.low, self.high]

    def sample(self, rng: random.Random) -> Any:
        if self.kind == "choice":
            return self.choices[rng.randrange(len(self.choices))]
        if self.kind == "int":
            return rng.randint(int(self.low), int(self.high))
        if self.kind == "loguniform":
            value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        else:
            value = rng.uniform(self.low, self.high)
        return min(max(float(f"{value:.3g}"), self.low), self.high)  # three digits, still within the bounds

    def grid(self) -> Sequence[Any]:
        """Every value of a grid search: the choices, or each integer of an ``int`` range (a ``range``: sized
        and indexed, never built)."""
        if self.kind == "choice":
            return self.choices
        if self.kind == "int":
            return range(int(self.low), int(self.high) + 1)
        raise CliError(
            f"--algorithm grid takes choice(...) and int(...) spaces only; --param {self.key} is {self.kind}",
            hint=f"write its grid points out: --param {self.key}=choice(A,B,C), or use --algorithm random",
        )


def grid_points(spaces: Sequence[Space]) -> Iterator[dict[str, Any]]:
    """The grid's points one at a time, in ``itertools.product``'s order (the last space varies fastest): the
    n-th point is made from n's digits in the spaces' sizes, so no grid is copied (``itertools.product``
    first makes a tuple of each) and a sweep that runs two points of 10^9 makes two."""
    grids = [space.grid() for space in spaces]
    sizes = [len(grid) for grid in grids]
    for n in range(math.prod(sizes)):
        point = {}
        for space, grid, size in zip(reversed(spaces), reversed(grids), reversed(sizes)):
            n, i = divmod(n, size)
            point[space.key] = grid[i]
        yield {space.key: point[space.key] for space in spaces}


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def parse_space(text: str) -> Space:
    """``KEY=SPACE`` -> :class:`Space`; each problem is one line naming the flag and the fix."""
    from trainer.config.overrides import KEY, parse_value  # pydantic: kept out of the CLI's import
    from trainer.config.schema import ConfigError

    key, sep, body = text.partition("=")
    key = key.strip()
    if not sep or not KEY.fullmatch(key):
        raise CliError(
            f"--param must be KEY=SPACE with a dotted config key, got {text!r}",
            hint="e.g. --param training.learning_rate=loguniform(1e-5,2e-4)",
        )
    match = _SPACE.fullmatch(body)
    if not match or match.group(1) not in KINDS:
        raise CliError(f"--param {key}: the space must be one of {', '.join(k + '(...)' for k in KINDS)}, got {body!r}")
    kind, inner = match.groups()
    items = [item.strip() for item in inner.split(",")] if inner.strip() else []
    if not items or any(not item for item in items):
        raise CliError(f"--param {key}: the space {body.strip()} is empty", hint="give it at least one value")
    try:
        values = [parse_value(item) for item in items]
    except ConfigError as e:
        raise CliError(f"--param {key}: {e}") from None
    if kind == "choice":
        if len(set(map(repr, values))) != len(values):
            raise CliError(f"--param {key}: {body.strip()} names a value twice; keep one")
        return Space(key, kind, choices=tuple(values))
    return _range(key, kind, body.strip(), values)


def _range(key: str, kind: str, body: str, values: list[Any]) -> Space:
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if len(values) != 2 or not numeric:
        raise CliError(f"--param {key}: {kind}(LOW, HIGH) takes two numbers, got {body}")
    low, high = values
    if kind == "int" and not all(isinstance(v, int) for v in values):
        raise CliError(f"--param {key}: int(LOW, HIGH) takes two integers, got {body}")
    empty = high < low if kind == "int" else high <= low  # int(3,3) is one value; uniform(3,3) none
    if empty:
        raise CliError(f"--param {key}: {body} is empty (LOW must be below HIGH)")
    if kind == "loguniform" and low <= 0:
        raise CliError(f"--param {key}: loguniform needs LOW > 0, got {body}", hint="or use uniform(...)")
    if kind != "int":
        low, high = float(low), float(high)
    return Space(key, kind, low=low, high=high)
