"""The sweep kinds beside the job kinds: a Katib ``Experiment`` and a Trainer ``OptimizationJob``, one
:class:`SweepKind` each, whose trial template is a job kind's own render (:func:`operator_cli.render.render`).

A sweep renders as the trial job's ConfigMap (its config without ``export``: trials export nothing), the claim
``--pvc-size`` asks for, and the sweep object, whose controller creates one job per trial from the template.
Each trial's values reach the trainer as ``colbert-train --set KEY=VALUE`` arguments added to the template
(:mod:`trainer.config.overrides`), in the syntax of the controller's substitution; every value a sweep lists is
written so that the trainer's ``--set`` reads it back exactly (:func:`trial_value`), checked as it is rendered.

Adding a kind: a :class:`SweepKind` subclass listed in :data:`SWEEPS`, and its template.
"""

from __future__ import annotations

import dataclasses
import json
import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from operator_cli import constants as C
from operator_cli.errors import CliError
from operator_cli.jobshape import SweepShape
from operator_cli.kube.kinds.base import find_all, job_state

__all__ = ["SweepKind", "add_args", "plain_value", "sweep_state", "trial_value"]


def plain_value(value: Any) -> str:
    """A value as the controllers take it: a string. A float keeps a ``.`` in its mantissa, so that no YAML
    reader (1.1 or 1.2) takes the string for a number.

    >>> plain_value(1e-05), plain_value(0.0002), plain_value(3), plain_value("cosine"), plain_value(True)
    ('1.0e-05', '0.0002', '3', 'cosine', 'true')
    """
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        text = repr(value)
        mantissa, e, exponent = text.partition("e")
        return f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text
    return str(value)


def trial_value(key: str, value: Any) -> str:
    """``value`` as the text whose ``colbert-train --set KEY=TEXT`` gives it back exactly, through the trainer's
    own reader (:func:`trainer.config.overrides.parse_override`, tried here on each spelling): ``null`` for
    None, ``.inf`` for infinity, a string that YAML would read as something else single-quoted. The controller
    pastes the text into the trial's JSON as it is (Katib's ``${trialParameters.NAME}``), so it holds no
    double quote, backslash or control character. A value no text gives back is one line, before anything
    is created.

    >>> [trial_value("training.max_steps", v) for v in (None, 100)], trial_value("training.max_grad_norm", 1e-05)
    (['null', '100'], '1.0e-05')
    >>> [trial_value("data.train.columns.query", v) for v in ("a b", "true", "None", " it's")]
    ['a b', 'true', 'None', "' it''s'"]
    """
    from trainer.config.overrides import parse_override
    from trainer.config.schema import ConfigError

    got: Any = None
    for text in _spellings(value):
        if json.dumps(text, ensure_ascii=False)[1:-1] != text:
            continue  # it would change, or break, the JSON the controller pastes it into
        try:
            got = parse_override(f"{key}={text}")[1]
        except ConfigError:
            continue
        if type(got) is type(value) and (got == value or got != got and value != value):  # NaN is itself
            return text
    raise CliError(
        f"--param {key}: the value {value!r} cannot be written so that a trial's --set reads it back"
        + (f" (it reads {got!r})" if got is not None else " (the controller pastes it into the trial's JSON)"),
        hint="use another value in the space (no double quote, backslash or control character), or --local",
    )


def _spellings(value: Any) -> list[str]:
    """The texts to try for a value, the plainest first."""
    if value is None:
        return ["null"]
    if isinstance(value, float) and not math.isfinite(value):
        return [".nan" if value != value else ".inf" if value > 0 else "-.inf"]
    if isinstance(value, str):
        return [value, "'" + value.replace("'", "''") + "'"]  # YAML's single quotes: no escapes to undo
    return [plain_value(value)]


def add_args(job: dict[str, Any], args: list[str]) -> None:
    """Append ``args`` to the trainer's arguments wherever the job keeps them (every replica of a PyTorchJob, the
    ``trainer`` of a TrainJob)."""
    trainer = job["spec"].get("trainer")
    if trainer is not None:
        trainer["args"] = [*trainer.get("args", []), *args]
        return
    for containers in find_all(job["spec"], "containers"):
        for container in containers:
            if container.get("name") == C.CONTAINER:
                container["args"] = [*container.get("args", []), *args]


def sweep_state(obj: dict[str, Any]) -> str:
    """The newest true condition, as for a job (Katib: Created, Running, Succeeded, Failed...)."""
    return job_state(obj)


class SweepKind(ABC):
    """One hyperparameter-search API: where it lives, how a sweep renders as it, and how its trials read."""

    api: ClassVar[str]  # the --engine value, and the chart's tune.engine
    group: ClassVar[str]
    version: ClassVar[str]
    plural: ClassVar[str]
    kind: ClassVar[str]
    product: ClassVar[str]
    install: ClassVar[str]
    template: ClassVar[str]
    trial_api: ClassVar[str]  # the job kind (--api) its trials are
    experimental: ClassVar[bool] = False

    @property
    def crd(self) -> str:
        return f"{self.plural}.{self.group}"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def __repr__(self) -> str:
        return f"<SweepKind {self.kind}>"

    def check(self, sweep: SweepShape) -> None:  # noqa: B027 (a hook)
        """What this API cannot express, refused in one line."""

    @abstractmethod
    def trial_args(self, sweep: SweepShape) -> list[str]:
        """The trainer arguments each trial adds, in the controller's substitution syntax."""

    @abstractmethod
    def context(self, sweep: SweepShape, trial: dict[str, Any]) -> dict[str, Any]:
        """What the template reads besides ``spec`` (the trial job's JobSpec) and ``sweep``."""

    def render(self, sweep: SweepShape) -> list[dict[str, Any]]:
        """ConfigMap, [PVC], then the sweep object: what ``tune --dry-run`` prints and ``tune`` creates."""
        from operator_cli.render import render, render_one

        self.check(sweep)
        job = dataclasses.replace(sweep.job, config_text=sweep.trial_config({}))
        objects = render(job)
        trial = objects.pop()  # the job itself: the template of every trial
        add_args(trial, self.trial_args(sweep))
        context = {"kind": self, "names": job.names, "sweep": sweep, **self.context(sweep, trial)}
        return [*objects, render_one(self.template, job, **context)]

    @abstractmethod
    def trials(self, cluster: Any, sweep: dict[str, Any]) -> list[dict[str, Any]]:
        """Each trial of a live sweep: name, values, state, metric, seconds, reason."""

    def best_name(self, sweep: dict[str, Any]) -> str | None:  # noqa: B027
        """The trial the controller calls best, where it says."""
        return None

    # ---- the API ---------------------------------------------------------------------------------------
    def create(self, custom: Any, namespace: str, obj: dict[str, Any]) -> Any:
        return custom.create_namespaced_custom_object(self.group, self.version, namespace, self.plural, obj)

    def get(self, custom: Any, namespace: str, name: str) -> Any:
        return custom.get_namespaced_custom_object(self.group, self.version, namespace, self.plural, name)

    def delete(self, custom: Any, namespace: str, name: str) -> Any:
        return custom.delete_namespaced_custom_object(
            self.group, self.version, namespace, self.plural, name, propagation_policy="Foreground"
        )

    def list(self, custom: Any, namespace: str | None, selector: str, limit: int | None = None) -> Any:
        extra = {k: v for k, v in (("label_selector", selector), ("limit", limit)) if v}
        if namespace is None:
            return custom.list_cluster_custom_object(self.group, self.version, self.plural, **extra)
        return custom.list_namespaced_custom_object(self.group, self.version, namespace, self.plural, **extra)
