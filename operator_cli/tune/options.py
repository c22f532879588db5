"""The sweep's own options, declared once: :data:`TUNE_OPTIONS`, beside the trial job's (the job options of
``submit``, :data:`operator_cli.options.JOB_OPTIONS`). Each becomes a :class:`operator_cli.tune.spec.SweepSpec`
field of the same name, whose construction checks it; defaults are the spec's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from operator_cli.kube.kinds import SWEEPS

__all__ = ["TUNE_OPTIONS", "TuneOption", "tune_options"]


@dataclass(frozen=True)
class TuneOption:
    flag: str
    help: str
    kwargs: dict[str, Any]


TUNE_OPTIONS: tuple[TuneOption, ...] = (
    TuneOption(
        "--param",
        "KEY=SPACE: a config key and its values: loguniform(A,B), uniform(A,B), int(A,B) or "
        "choice(X,Y,...); checked against the config schema. Repeat it for each key.",
        {"multiple": True, "metavar": "KEY=SPACE"},
    ),
    TuneOption(
        "--metric",
        "The objective: a metric metrics.json reports on data.eval_beir's split.",
        {"default": "ndcg@10", "show_default": True},
    ),
    TuneOption(
        "--goal",
        "Maximise or minimise the metric.",
        {"type": click.Choice(["max", "min"]), "default": "max", "show_default": True},
    ),
    TuneOption("--trials", "Trials to run. Default: every grid point, else 8.", {"type": int}),
    TuneOption("--parallel", "Trials at once.", {"type": int, "default": 1, "show_default": True}),
    TuneOption(
        "--algorithm",
        "random, grid (choice and int spaces), or bayesian (Katib only).",
        {"type": click.Choice(["random", "grid", "bayesian"]), "default": "random", "show_default": True},
    ),
    TuneOption(
        "--seed",
        "The random search's seed: the same seed draws the same trials.",
        {"type": int, "default": 0, "show_default": True},
    ),
    TuneOption(
        "--max-failed",
        "Stop starting trials once more than this many have failed.",
        {"type": int, "default": 3, "show_default": True},
    ),
    TuneOption(
        "--early-stop",
        "Stop a trial whose intermediate figure (evaluation.every_steps) is worse than the median of the "
        "succeeded trials' at the same step: Katib's medianstop, or the local engine's.",
        {"type": click.Choice(["median"]), "default": None},
    ),
    TuneOption(
        "--early-stop-setting",
        "KEY=VALUE, Katib's medianstop names: min_trials_required (default 3: succeeded trials before a "
        "median is taken), start_step (default 4: a trial's reports before it can be stopped). Repeatable.",
        {"multiple": True, "metavar": "KEY=VALUE"},
    ),
    TuneOption(
        "--allow-test-split",
        "Choose by a config whose data.eval_split is test (its figure is then no longer a test figure).",
        {"is_flag": True},
    ),
    TuneOption(
        "--engine",
        "Where the sweep runs on a cluster: "
        + ", ".join(f"{k} ({s.kind}{', experimental' if s.experimental else ''})" for k, s in SWEEPS.items())
        + ".",
        {"type": click.Choice(list(SWEEPS)), "default": next(iter(SWEEPS)), "show_default": True},
    ),
    TuneOption(
        "--local", "Run the trials on this machine, each replayed as `colbert-k8s local` does.", {"is_flag": True}
    ),
    TuneOption(
        "--workdir",
        "--local: the stand-in for the volume; the sweep keeps tune/NAME/ under it.",
        {"type": click.Path(file_okay=False), "default": ".", "show_default": True},
    ),
    TuneOption(
        "--dry-run",
        "--dry-run=client: print what would be created (the sweep object and its ConfigMap; "
        "with --local, the trials), and stop.",
        {"type": click.Choice(["client"]), "is_flag": False, "flag_value": "client", "default": None},
    ),
    TuneOption(
        "-o",
        "With --dry-run: yaml or json.",
        {"type": click.Choice(["yaml", "json"]), "default": "yaml", "show_default": True},
    ),
)


def tune_options(fn):
    """The sweep's options, as click options (after the job's own)."""
    for option in reversed(TUNE_OPTIONS):
        flags = ("-o", "--output") if option.flag == "-o" else (option.flag,)
        fn = click.option(*flags, help=option.help, **option.kwargs)(fn)
    return fn
