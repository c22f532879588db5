"""The sweep's result: the best trial's model, exported to ``export.destination`` of ``--config`` with a card
that names the sweep, the trial and the search space.

The trials themselves export nothing (their configs have no ``export``): only once the best is known is its
output copied (hard links where the disk allows) into ``tune/NAME/best/``, its ``metrics.json`` given a
``sweep`` entry and its card (``README.md``) written again from it, and that directory exported by the trainer's
own :func:`trainer.storage.export.run` (atomic, resumable, manifest last). A config without ``export`` keeps it
there: ``tune/NAME/best/`` is what ``serve --local`` takes.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from operator_cli.errors import CliError
from operator_cli.tune.spec import SweepSpec

__all__ = ["export_best", "preflight", "sweep_entry"]

_COPIED = ("final-model", "best-model", "index")
_MARK = ".colbert-k8s-tune-best"


def sweep_entry(sweep: SweepSpec, record: dict[str, Any], engine: str) -> dict[str, Any]:
    """What the card and ``metrics.json`` say about the sweep that chose this model."""
    best = record["best"]
    return {
        "name": sweep.name,
        "engine": engine,
        "algorithm": sweep.algorithm,
        "trials": len(record["trials"]),
        "succeeded": sum(t["state"] == "Succeeded" for t in record["trials"]),
        "trial": best["name"],
        "metric": sweep.metric,
        "goal": sweep.goal,
        "value": best["metric"],
        "split": sweep.job.train_config.data.eval_split,
        "space": {p.key: p.text for p in sweep.params},
        "values": best["values"],
    }


def preflight(sweep: SweepSpec) -> None:
    """Before the first trial: the export destination takes writes (one line, exit 2, when it does not)."""
    cfg = sweep.config
    if cfg.export is None:
        return
    from trainer.config.schema import ConfigError
    from trainer.storage.export import preflight as export_preflight

    try:
        export_preflight(cfg)
    except ConfigError as e:
        raise CliError(str(e)) from None


def export_best(sweep: SweepSpec, record: dict[str, Any], root: Path, echo: Callable[[str], None]) -> None:
    """Stage the best trial's output with the sweep's card in ``root/best``, and export it where ``--config``
    says (a config without ``export`` keeps it there)."""
    from trainer.atomic import write_text
    from trainer.storage import card
    from trainer.storage.export import ExportFailed, run

    best = record["best"]
    source = Path(best["output"])
    base = sweep.config
    staged = _stage(source, root / "best", base.export.include if base.export else [])
    metrics = json.loads((source / "metrics.json").read_text())
    metrics["sweep"] = sweep_entry(sweep, record, "local")
    trial_cfg = _trial_config(sweep, best["values"])
    # the card's snippet loads the model from where it is: the export, or tune/NAME/best/ under --workdir
    shown = str(staged) if base.export else f"tune/{sweep.name}/best"
    cfg = trial_cfg.model_copy(update={"output_dir": shown, "export": base.export})
    write_text(staged / "metrics.json", json.dumps(metrics, indent=2) + "\n")
    (staged / "final-model" / "manifest.json").unlink(missing_ok=True)  # a hard link: written anew, not through
    card.update(staged / "final-model", cfg, metrics)  # the card names the sweep; the model's manifest follows it
    if base.export is None:
        echo(
            f"best model: {staged} ({best['name']}'s output; its card and metrics.json name the sweep): "
            f"`colbert-k8s serve --local {staged}` serves it; export.destination in --config would export it"
        )
        return
    try:
        result = run(cfg)
    except ExportFailed as e:
        raise CliError(
            f"export of the best trial {best['name']}: {e}",
            hint="run the same command again: the trials are kept and the export resumes",
            exit_code=1,
        ) from None
    echo(f"exported {best['name']}'s model to {result['destination']} ({result['files']} files, with its card)")


def _trial_config(sweep: SweepSpec, values: dict[str, Any]):
    from trainer.config.load import load_yaml, parse_config

    return parse_config(load_yaml(sweep.trial_config(values), "trial"), "trial")


def _stage(source: Path, staged: Path, include: list[str]) -> Path:
    """``staged`` made afresh from the trial's output (only a directory this module made is ever emptied)."""
    if staged.exists():
        if not (staged / _MARK).is_file():
            raise CliError(
                f"{staged} exists and was not made by `colbert-k8s tune`; it is left as it is", hint="move it away"
            )
        shutil.rmtree(staged)
    staged.mkdir(parents=True)
    (staged / _MARK).write_text("the best trial's output, staged for export by `colbert-k8s tune`\n")
    wanted = [*_COPIED, *(["checkpoints"] if "checkpoint" in include else [])]
    for name in wanted:
        if (source / name).is_dir():
            shutil.copytree(source / name, staged / name, copy_function=_link_or_copy)
    return staged


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
