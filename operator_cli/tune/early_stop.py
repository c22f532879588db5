"""Median stopping: a trial whose intermediate figure is worse than the median of the finished trials' is stopped.

A sweep's trials are whole jobs (mining, training, evaluation), so a bad one costs as much as a good one unless
it is stopped. The trainer reports intermediate values only where it evaluates during training
(``evaluation.every_steps``): each periodic evaluation is appended to ``--metrics-file`` as it happens
(:mod:`trainer.reporting.metrics_file`). ``--early-stop median`` acts on them:

* **on Katib**, as the Experiment's ``earlyStopping: {algorithmName: medianstop}``, whose settings keep Katib's
  names: ``min_trials_required`` (succeeded trials before a median is taken) and ``start_step`` (a trial's
  reports before it can be stopped). Katib's median is that of each succeeded trial's mean over its first
  ``start_step`` reports, and its collector compares a running trial's best value so far with it;
* **locally** (:mod:`operator_cli.tune.local`), a running trial is stopped once it has reported ``start_step``
  values and its latest one, at step S, is worse than the median of the succeeded trials' values at the same
  step S, where at least ``min_trials_required`` of them reported one: the same rule, compared step for step.

An early-stopped trial keeps its checkpoint and its reason; it is never the best (it has no final model), never
run again, and never counted as failed.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from operator_cli.errors import CliError

__all__ = ["ALGORITHMS", "EarlyStop", "intermediate"]

ALGORITHMS = {"median": "medianstop"}  # --early-stop NAME: Katib's algorithmName
DEFAULTS = {"min_trials_required": 3, "start_step": 4}  # Katib's medianstop defaults


@dataclass(frozen=True)
class EarlyStop:
    """A validated ``--early-stop median`` with its settings (Katib's names)."""

    algorithm: str = "median"
    min_trials_required: int = DEFAULTS["min_trials_required"]
    start_step: int = DEFAULTS["start_step"]

    @classmethod
    def parse(cls, algorithm: str | None, settings: Iterable[str] = ()) -> EarlyStop | None:
        """``--early-stop`` and its ``--early-stop-setting KEY=VALUE`` (repeatable); None when not asked for.

        >>> EarlyStop.parse("median", ["min_trials_required=2"])
        EarlyStop(algorithm='median', min_trials_required=2, start_step=4)
        """
        settings = list(settings)
        if algorithm is None:
            if settings:
                raise CliError("--early-stop-setting needs --early-stop median")
            return None
        if algorithm not in ALGORITHMS:
            raise CliError(f"--early-stop {algorithm!r} is not an early-stopping rule; use one of {list(ALGORITHMS)}")
        values = dict(DEFAULTS)
        for text in settings:
            key, sep, raw = text.partition("=")
            if not sep or key.strip() not in DEFAULTS:
                raise CliError(
                    f"--early-stop-setting {text!r}: give KEY=VALUE with KEY one of {', '.join(DEFAULTS)}",
                    hint="e.g. --early-stop-setting min_trials_required=3 --early-stop-setting start_step=4",
                )
            try:
                values[key.strip()] = int(raw)
            except ValueError:
                values[key.strip()] = 0
            if values[key.strip()] < 1:
                raise CliError(f"--early-stop-setting {text!r}: {key.strip()} must be a whole number of at least 1")
        return cls(algorithm, **values)

    def check(self, cfg: Any, searched: set[str]) -> None:
        """One line when no trial could be stopped: the config evaluates only at the end, or a trial's periodic
        evaluations (``max_steps`` fixed by the config) are fewer than ``start_step``."""
        every = cfg.evaluation.every_steps
        if not every and "evaluation.every_steps" in searched:
            return
        if not every:
            raise CliError(
                "--early-stop median needs intermediate values, and the config evaluates only after training",
                hint="set evaluation.every_steps (e.g. a tenth of training.max_steps)",
            )
        steps = cfg.training.max_steps
        if steps and "training.max_steps" not in searched and "evaluation.every_steps" not in searched:
            reports = (steps - 1) // every  # evaluations at every_steps, 2 x every_steps, ... before the last step
            if reports < self.start_step:
                raise CliError(
                    f"--early-stop median: a trial evaluates {reports} time(s) during training "
                    f"(evaluation.every_steps {every} in {steps} steps), fewer than start_step {self.start_step}: "
                    "no trial could be stopped",
                    hint="lower evaluation.every_steps, or pass --early-stop-setting start_step=N",
                )

    def katib(self) -> dict[str, Any]:
        """The Experiment's ``earlyStopping``.

        >>> EarlyStop().katib()["algorithmSettings"][0]
        {'name': 'min_trials_required', 'value': '3'}
        """
        return {
            "algorithmName": ALGORITHMS[self.algorithm],
            "algorithmSettings": [
                {"name": "min_trials_required", "value": str(self.min_trials_required)},
                {"name": "start_step", "value": str(self.start_step)},
            ],
        }

    def verdict(self, running: list[dict], finished: list[list[dict]], metric: str, goal: str) -> str | None:
        """Why the running trial is to be stopped (one line), or None. ``running`` and each of ``finished`` are
        a trial's metrics-file lines (:func:`trainer.reporting.metrics_file.read_lines`).

        >>> line = lambda step, v: {"step": step, "ndcg@10": v, "final": False}
        >>> done = [[line(8, v), line(16, v)] for v in (0.30, 0.32, 0.34)]
        >>> rule = EarlyStop(min_trials_required=3, start_step=2)
        >>> rule.verdict([line(8, 0.1)], done, "ndcg@10", "max") is None  # one report: too early
        True
        >>> rule.verdict([line(8, 0.1), line(16, 0.31)], done, "ndcg@10", "max")
        'ndcg@10 0.3100 at step 16 is below the median 0.3200 of 3 succeeded trials at that step'
        """
        own = intermediate(running, metric)
        if len(own) < self.start_step:
            return None
        step, value = max(own.items())
        theirs = [v for lines in finished if (v := intermediate(lines, metric).get(step)) is not None]
        if len(theirs) < self.min_trials_required:
            return None
        median = statistics.median(theirs)
        worse = value < median if goal == "max" else value > median
        if not worse:
            return None
        side = "below" if goal == "max" else "above"
        return (
            f"{metric} {value:.4f} at step {step} is {side} the median {median:.4f} of {len(theirs)} succeeded "
            "trials at that step"
        )


def intermediate(lines: list[dict], metric: str) -> dict[int, float]:
    """A trial's periodic values of ``metric`` by step (the final line left out; a step evaluated again after a
    resume keeps its newest value).

    >>> intermediate([{"step": 8, "m": 0.1, "final": False}, {"step": 8, "m": 0.2, "final": False},
    ...               {"step": 16, "m": 0.3, "final": True}], "m")
    {8: 0.2}
    """
    return {line["step"]: line[metric] for line in lines if not line["final"] and metric in line}
