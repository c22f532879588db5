"""The typed sweep: the trial job (a :class:`JobSpec`), the search space, the objective and the budget, checked
on construction, before any trial starts or any object is sent.

Every engine reads the same :class:`SweepSpec`: the local one runs :meth:`SweepSpec.plan`'s trials, the cluster
ones render it as an Experiment or an OptimizationJob whose controller draws the trials. What is refused, each in
one line (exit 2): a ``--param`` key the config schema does not have, a space the schema refuses at one of its
edges (``training.learning_rate=uniform(0,1)``: 0 is not a learning rate), an empty space, a ``--metric`` that
``metrics.json`` does not report, a config that evaluates nothing (no trial would report the metric), and a
config whose evaluation split is ``test`` (a figure chosen on the test split is no longer a test figure) unless
``--allow-test-split``.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
import random
from dataclasses import dataclass
from typing import Any

from operator_cli.errors import CliError
from operator_cli.spec import JobSpec
from operator_cli.tune.early_stop import EarlyStop
from operator_cli.tune.space import Space, grid_points

__all__ = ["ALGORITHMS", "GOALS", "SweepSpec", "Trial", "key_exists", "without_export"]

ALGORITHMS = ("random", "grid", "bayesian")
GOALS = ("max", "min")
DEFAULT_TRIALS = 8
# keys a sweep must not vary: what it sets per trial itself, and what the objective is measured on
_FIXED = {
    "output_dir": "each trial's output directory is the sweep's to set",
    "export": "the sweep exports the best trial's model itself (export.destination of --config)",
    "data.eval_beir": "the objective's data must be the same for every trial",
    "data.eval_split": "the objective's data must be the same for every trial",
    "evaluation.after_training": "every trial must report the metric",
}


@dataclass(frozen=True)
class Trial:
    """One trial of a sweep: its index, its name (a job name) and its values by config key."""

    index: int
    name: str
    values: dict[str, Any]

    @property
    def overrides(self) -> list[str]:
        """As ``colbert-train --set`` takes them."""
        return [f"{key}={value}" for key, value in self.values.items()]


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep: every value an engine needs, checked on construction."""

    job: JobSpec
    """The trial job as ``submit`` would render it, its config ``config_text`` without ``export`` (the trials
    export nothing); its name is the sweep's."""
    params: tuple[Space, ...]
    config_text: str = ""
    """``--config`` as given: its ``export`` is where the best trial's model goes. Default: the job's."""
    metric: str = "ndcg@10"
    goal: str = "max"
    trials: int | None = None
    """Trials to run; None: every grid point, or 8 for random and bayesian."""
    parallel: int = 1
    algorithm: str = "random"
    seed: int = 0
    max_failed: int = 3
    """The sweep stops once more than this many trials have failed."""
    allow_test_split: bool = False
    early_stop: EarlyStop | None = None
    """``--early-stop median``: stop a trial whose intermediate figure is below the finished trials' median."""

    def __post_init__(self) -> None:
        from trainer.config.schema import METRICS  # pydantic: kept out of the CLI's import

        if not self.config_text:
            object.__setattr__(self, "config_text", self.job.config_text)
        if not self.params:
            raise CliError(
                "tune needs at least one --param KEY=SPACE",
                hint="e.g. --param training.learning_rate=loguniform(1e-5,2e-4)",
            )
        if self.metric not in METRICS:
            raise CliError(
                f"--metric {self.metric!r} is not a metric metrics.json reports on data.eval_beir",
                hint=f"one of {', '.join(METRICS)}",
            )
        if self.goal not in GOALS or self.algorithm not in ALGORITHMS:
            raise CliError(f"--goal must be one of {GOALS} and --algorithm one of {ALGORITHMS}")
        if self.trials is not None and self.trials < 1 or self.parallel < 1 or self.max_failed < 0:
            raise CliError("--trials and --parallel must be at least 1, --max-failed at least 0")
        keys = [p.key for p in self.params]
        for key in {k for k in keys if keys.count(k) > 1}:
            raise CliError(f"--param {key} is given twice; keep one")
        self._check_objective()
        if self.early_stop is not None:
            self.early_stop.check(self.job.train_config, set(keys))
        for space in self.params:
            self._check_space(space)
        if self.algorithm == "grid":
            for space in self.params:
                space.grid()  # a continuous space has no grid: one line
        if self.parallel > self.trial_count:
            raise CliError(f"--parallel {self.parallel} is more than the sweep's {self.trial_count} trial(s)")
        self._check_trial_name()  # a sweep name too long for its trials' pods: one line

    # ---- checks ----------------------------------------------------------------------------------------
    def _check_objective(self) -> None:
        cfg = self.job.train_config
        if not cfg.data.eval_beir or not cfg.evaluation.after_training:
            raise CliError(
                f"no trial would report {self.metric}: the config evaluates nothing after training",
                hint="set data.eval_beir (a BEIR directory with a dev split) and evaluation.after_training: true",
            )
        if cfg.data.eval_split == "test" and not self.allow_test_split:
            raise CliError(
                "tune chooses the best trial by data.eval_split, which is 'test': a figure chosen on the test "
                "split is no longer a test figure",
                hint="set data.eval_split: dev (qrels/dev.tsv in data.eval_beir), or pass --allow-test-split",
            )

    def _check_space(self, space: Space) -> None:
        """The key exists in the schema and every edge of the space is a value the schema accepts there."""
        from trainer.config.load import load_yaml, parse_config
        from trainer.config.overrides import apply
        from trainer.config.schema import ConfigError

        for prefix, why in _FIXED.items():
            if space.key == prefix or space.key.startswith(prefix + "."):
                raise CliError(f"--param {space.key}: {why}; it cannot be searched")
        if not key_exists(space.key):
            from trainer.config.overrides import config_keys

            near = difflib.get_close_matches(space.key, config_keys(), n=1, cutoff=0.6)
            raise CliError(
                f"--param {space.key}: the config has no such key; "
                + (f"did you mean {near[0]}?" if near else "check its spelling"),
                hint="see docs/trainer.md for every key",
            )
        base = load_yaml(self.config_text, "--config")
        for value in space.edges():
            data = apply(base, space.key.split("."), value)
            try:
                parse_config(data, "config")
            except ConfigError as e:
                said = str(e).removeprefix("config: ")
                raise CliError(f"--param {space.key}={space.text}: with {space.key}={value}, {said}") from None

    # ---- the trials ------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.job.name

    @property
    def trial_count(self) -> int:
        if self.algorithm == "grid":
            points = math.prod(len(space.grid()) for space in self.params)
            return min(points, self.trials or points)
        return self.trials or DEFAULT_TRIALS

    def trial_names(self) -> list[str]:
        """``<sweep>-t1`` ...: job names, checked as a job's name is (its pods' names within 63 characters)."""
        self._check_trial_name()
        return [f"{self.name}-t{i + 1}" for i in range(self.trial_count)]

    def _check_trial_name(self) -> None:
        """The longest trial name is a job name (checked without listing every trial's)."""
        last = f"{self.name}-t{self.trial_count}"
        try:
            dataclasses.replace(self.job, name=last)
        except CliError as e:
            raise CliError(f"--name {self.name}: its trial {last}: {e.message}", hint="pass a shorter --name") from None

    def plan(self) -> list[Trial]:
        """The trials the local engine runs, in order: every grid point, or draws that depend on the seed and the
        trial's index alone (a resumed sweep draws the same ones)."""
        names = self.trial_names()
        if self.algorithm == "grid":
            rows = list(itertools.islice(grid_points(self.params), len(names)))  # only the points it runs
        else:
            if self.algorithm == "bayesian":
                raise CliError(
                    "--algorithm bayesian needs a cluster engine (Katib's bayesianoptimization)",
                    hint="use --algorithm random or grid with --local",
                )
            rows = []
            for i in range(self.trial_count):
                rng = random.Random(f"{self.seed}/{i}")
                rows.append({space.key: space.sample(rng) for space in self.params})
        return [Trial(i + 1, name, values) for i, (name, values) in enumerate(zip(names, rows))]

    def trial_config(self, values: dict[str, Any]) -> str:
        """The trial's config: ``--config`` with the trial's values, and without ``export`` (the sweep exports the
        best trial's model once it is known, not every trial's)."""
        import yaml

        from trainer.config.load import load_yaml
        from trainer.config.overrides import apply

        data = load_yaml(self.config_text, "--config")
        for key, value in values.items():
            data = apply(data, key.split("."), value)
        data.pop("export", None)
        return yaml.safe_dump(data, sort_keys=False)

    @property
    def config(self):
        """``--config`` as the schema reads it (with its ``export``)."""
        from operator_cli.spec import parse_training_config

        return parse_training_config(self.config_text)

    def describe(self) -> dict[str, Any]:
        """What identifies the sweep (stored with a local sweep: a rerun must ask for the same one)."""
        return {
            "name": self.name,
            "metric": self.metric,
            "goal": self.goal,
            "algorithm": self.algorithm,
            "seed": self.seed,
            "space": {p.key: p.text for p in self.params},
            "trials": [{"name": t.name, "values": t.values} for t in self.plan()],
            "config": self.config_text,
        }


def without_export(config_text: str) -> str:
    r"""The config a sweep's trials run: ``export`` removed (the sweep exports the best trial's model once).

    >>> without_export("data: {train: {path: x}}\nexport: {destination: s3://b/p/}\n")
    'data:\n  train:\n    path: x\n'
    """
    import yaml

    from trainer.config.load import load_yaml

    data = load_yaml(config_text, "--config")
    if not isinstance(data, dict) or "export" not in data:
        return config_text
    data.pop("export")
    return yaml.safe_dump(data, sort_keys=False)


def key_exists(key: str) -> bool:
    """Whether the config schema has the dotted ``key`` (through optional sections and the loss's union): a key
    ``--set`` takes (:func:`trainer.config.overrides.config_keys`, one walk of the schema).

    >>> key_exists("training.learning_rate"), key_exists("mine.negatives"), key_exists("training.learnin_rate")
    (True, True, False)
    """
    from trainer.config.overrides import config_keys

    return key in config_keys()
