"""Where rank 0 reports scalars: ``metrics.jsonl``, TensorBoard, and MLflow / Weights & Biases.

``tracking.report_to`` lists the sinks, as HF's ``report_to`` does. ``jsonl`` appends one JSON object
per report to ``output_dir/metrics.jsonl`` (flushed, so ``tail -f`` works and a killed pod loses no
line); ``tensorboard`` writes event files under ``output_dir/tensorboard`` for ``tensorboard --logdir``;
``mlflow`` and ``wandb`` use their own clients, which read their settings and credentials from the
environment (``MLFLOW_TRACKING_URI``, ``WANDB_API_KEY``...: pass them with ``--secret-env``). A sink
whose package is missing is one line at start, not a failure an hour in.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from trainer.config.schema import ConfigError

__all__ = ["Tracker", "check_sinks"]

log = logging.getLogger(__name__)
_PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}


def check_sinks(report_to: list[str]) -> None:
    """Fail fast, before any training, when a requested sink's package is not installed."""
    for sink in report_to:
        package = _PACKAGES.get(sink)
        if package and importlib.util.find_spec(package) is None:
            raise ConfigError(
                f"tracking.report_to: {sink} needs the {package} package; install it in the image "
                f"(pip install {package}) or remove {sink}"
            )


class Tracker:
    """No-op on ranks other than 0; every sink gets the same (step, values)."""

    def __init__(self, report_to: list[str], output_dir: str, run_name: str, config: dict, enabled: bool):
        self.sinks: list[Any] = []
        if not enabled:
            return
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        for sink in report_to:
            self.sinks.append(_SINKS[sink](out, run_name, config))

    def log(self, step: int, values: dict[str, float], prefix: str = "") -> None:
        flat = {f"{prefix}{k}": float(v) for k, v in values.items() if isinstance(v, (int, float))}
        for sink in self.sinks:
            sink.log(step, flat)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


class _Jsonl:
    def __init__(self, out: Path, run_name: str, config: dict):
        self.f = open(out / "metrics.jsonl", "a", encoding="utf-8")  # closed in close()

    def log(self, step: int, values: dict[str, float]) -> None:
        self.f.write(json.dumps({"step": step, "time": round(time.time(), 3), **values}) + "\n")
        self.f.flush()

    def close(self) -> None:
        self.f.close()


class _TensorBoard:
    def __init__(self, out: Path, run_name: str, config: dict):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(out / "tensorboard"))

    def log(self, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _Mlflow:
    def __init__(self, out: Path, run_name: str, config: dict):
        import mlflow

        mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME", "colbert-k8s"))
        self.mlflow, self.run = mlflow, mlflow.start_run(run_name=run_name)
        mlflow.log_params({k: str(v)[:250] for k, v in flatten(config).items()})

    def log(self, step: int, values: dict[str, float]) -> None:
        self.mlflow.log_metrics({k.replace("@", "_at_"): v for k, v in values.items()}, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


class _Wandb:
    def __init__(self, out: Path, run_name: str, config: dict):
        import wandb

        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "colbert-k8s"), name=run_name, config=config, dir=str(out)
        )

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


_SINKS = {"jsonl": _Jsonl, "tensorboard": _TensorBoard, "mlflow": _Mlflow, "wandb": _Wandb}


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """Nested keys as dotted paths (MLflow's params, mining's fingerprint differences).

    >>> flatten({"a": {"b": 1}, "c": 2})
    {'a.b': 1, 'c': 2}
    """
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
