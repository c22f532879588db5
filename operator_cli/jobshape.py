"""What the job kinds, the scheduling rules and the renderer read of a job (and a sweep) spec, as Protocols.

:class:`operator_cli.spec.JobSpec` imports the kinds (its ``--api``) and the scheduling rules, and they (and
``render``, which the sweep kinds call) are handed the spec it builds: naming ``JobSpec`` (or ``SweepSpec``,
which holds one) in their hints closed an import loop, even one only a type checker reads. They name
:class:`JobShape` and :class:`SweepShape` instead, which the specs meet field for field
(``tests/test_layout.py`` checks it).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from operator_cli.kube.names import JobNames
from operator_cli.tune.space import Space

__all__ = ["JobShape", "SweepShape", "Templated"]


class Templated(Protocol):
    """A job kind as the renderer reads it: the template its job is written by."""

    @property
    def template(self) -> str: ...


@runtime_checkable
class JobShape(Protocol):
    """The fields of a validated job the kinds (pod names, what their API cannot express),
    ``operator_cli/scheduling.py`` and ``operator_cli/render.py`` read; read-only, as a frozen spec's are."""

    @property
    def name(self) -> str: ...
    @property
    def nodes(self) -> int: ...
    @property
    def gpus_per_node(self) -> int: ...
    @property
    def elastic(self) -> tuple[int, int] | None: ...
    @property
    def priority_class(self) -> str | None: ...
    @property
    def annotations(self) -> dict[str, str]: ...
    @property
    def topology_required(self) -> str | None: ...
    @property
    def topology_preferred(self) -> str | None: ...
    @property
    def topology_annotations(self) -> dict[str, str]: ...
    @property
    def mig(self) -> str | None: ...
    @property
    def pvc_size(self) -> str | None: ...
    @property
    def kind(self) -> Templated: ...
    @property
    def names(self) -> JobNames: ...


class SweepShape(Protocol):
    """What the sweep kinds read of a :class:`operator_cli.tune.spec.SweepSpec` (which holds a ``JobSpec``)."""

    @property
    def job(self) -> JobShape: ...
    @property
    def params(self) -> tuple[Space, ...]: ...
    @property
    def metric(self) -> str: ...
    @property
    def goal(self) -> str: ...
    @property
    def algorithm(self) -> str: ...
    @property
    def seed(self) -> int: ...
    @property
    def trial_count(self) -> int: ...
    def trial_config(self, values: dict[str, Any]) -> str: ...
