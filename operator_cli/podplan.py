"""What the cluster would run for a rendered job: pod host names, the trainer container, the pod spec,
and the launcher's environment, for a PyTorchJob (Training Operator v1.9.4) or a TrainJob (Trainer
v2.3.0 on JobSet); each job kind reads its own manifest (:meth:`operator_cli.kube.kinds.JobKind.plan`,
:func:`operator_cli.kube.kinds.plan_pods`). Plain data: the kinds import this module, never the reverse.
``colbert-k8s local`` replays this plan; it is read from the manifest, never from
the options, so the replay runs exactly what was rendered.

The environment each launcher injects (see ``shared/crds/PROVENANCE.md``):

==============  ===============================================================  ====================
API             variables                                                        master
==============  ===============================================================  ====================
PyTorchJob      MASTER_ADDR/PORT, WORLD_SIZE (= pods x nproc), RANK (= pod       ``<job>-master-0``,
                index), PET_MASTER_ADDR/PORT, PET_NNODES, PET_NPROC_PER_NODE,    the container port
                PET_NODE_RANK, PYTHONUNBUFFERED                                  (23456)
TrainJob        PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR,  ``<job>-node-0-0.<job>``,
                PET_MASTER_PORT only                                             29500
elastic         (Workers only) PET_RDZV_ENDPOINT, PET_RDZV_BACKEND=c10d,         ``<job>-worker-0``, the
PyTorchJob      PET_NNODES=MIN:MAX, PET_MAX_RESTARTS; no MASTER_*, RANK,         container port; its
                WORLD_SIZE or PET_NPROC_PER_NODE (the manifest sets the last)    agent hosts the store
==============  ===============================================================  ====================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from trainer.errors import PERMANENT_EXIT_CODES

__all__ = ["FailurePolicy", "Launcher", "PodPlan", "code_ranges", "operator_policy"]


class Launcher(Protocol):
    """What a plan asks of its job's kind (:class:`operator_cli.kube.kinds.JobKind`, which imports this module
    to make plans, so it is described here rather than imported): the environment its launcher injects."""

    def launcher_env(self, plan: PodPlan, index: int, master_addr: str, master_port: int) -> dict[str, str]: ...


@dataclass(frozen=True)
class FailurePolicy:
    """What a job's controller does when a replica fails, as ``colbert-k8s local`` replays it."""

    restarts: int
    """Restarts of the whole job before it fails (PyTorchJob ``backoffLimit``, JobSet ``maxRestarts``)."""
    permanent: tuple[tuple[int, int], ...] = ()
    """Inclusive exit-code ranges that fail the job at once, whatever restarts are left."""
    recreates_pods: bool = False
    """True when a restart makes new pods (JobSet Recreate, restartPolicy Never): emptyDirs start empty."""
    rule: str = ""
    """The manifest's words for the permanent rule, for the one line that reports it."""

    def is_permanent(self, code: int) -> bool:
        """``code`` as ``Popen.returncode`` (negative: a signal, never permanent).

        >>> FailurePolicy(3, ((2, 2),)).is_permanent(2), FailurePolicy(3, ((2, 2),)).is_permanent(-9)
        (True, False)
        """
        return any(low <= code <= high for low, high in self.permanent)


def code_ranges(codes: list[int]) -> tuple[tuple[int, int], ...]:
    """Exit codes as inclusive ranges of consecutive codes, for :attr:`FailurePolicy.permanent`.

    >>> code_ranges([5, 1, 2, 3, 9])
    ((1, 3), (5, 5), (9, 9))
    """
    ranges: list[tuple[int, int]] = []
    for code in sorted(set(codes)):
        if ranges and code == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], code)
        else:
            ranges.append((code, code))
    return tuple(ranges)


def operator_policy(restart_policy: str, backoff_limit: int) -> FailurePolicy:
    """The Training Operator's rule for a PyTorchJob replica: ``ExitCode`` fails the job at once on 1-127 and
    restarts on 128-255 and signals (the operator's fixed rule, which is why it is the trainer's too:
    ``trainer/errors.PERMANENT_EXIT_CODES``); ``OnFailure`` restarts on any failure; ``Never`` on none; all
    within ``runPolicy.backoffLimit``."""
    if restart_policy == "Never":
        return FailurePolicy(restarts=0)
    if restart_policy == "ExitCode":
        low, high = PERMANENT_EXIT_CODES
        return FailurePolicy(backoff_limit, (PERMANENT_EXIT_CODES,), rule=f"restartPolicy ExitCode ({low}-{high})")
    return FailurePolicy(backoff_limit)


@dataclass(frozen=True)
class PodPlan:
    """The pods a job's controller would run, read from its manifest by its kind (:meth:`JobKind.plan`)."""

    kind: Launcher  # the job's kind (PyTorchJob, TrainJob), which read the plan and injects its launcher's env
    name: str
    hosts: list[str]  # one per pod, in node-rank order
    replica_names: list[str]  # master-0, worker-0 ... or node-0, node-1 ...
    pod_spec: dict[str, Any]
    container: dict[str, Any]  # command, args, env, workingDir, resources of the trainer container
    restart_policy: str
    backoff_limit: int
    nproc: str  # as the launcher passes it (PET_NPROC_PER_NODE)
    elastic: tuple[int, int] | None = None  # elasticPolicy's (minReplicas, maxReplicas)
    max_restarts: int | None = None  # elasticPolicy.maxRestarts: torchrun's worker-group restarts
    failure: FailurePolicy = FailurePolicy(restarts=0)  # what the controller does when a replica fails
    runtime_note: str = ""  # a TrainJob's runtime as local knows it, for the "not honoured" line
    domain: str | None = None  # the pods' DNS subdomain (<host>.<domain>), where their controller makes one
    master_port: int | None = None  # the launcher's fixed port; None: the container port (a free one here)
    restart_limit: str = "backoffLimit"  # the manifest field that bounds the job's restarts, for messages

    def master(self, isolated_network: bool, free_port: int) -> tuple[str, int]:
        """The rendezvous address: the launcher's host name and port where names resolve (network
        namespaces with /etc/hosts), else loopback and a free port (several jobs may run here)."""
        if not isolated_network:
            return "127.0.0.1", free_port
        host = f"{self.hosts[0]}.{self.domain}" if self.domain else self.hosts[0]
        return host, self.master_port or free_port

    def launcher_env(self, index: int, master_addr: str, master_port: int) -> dict[str, str]:
        """The variables the job's controller injects into pod ``index`` (its kind's)."""
        return self.kind.launcher_env(self, index, master_addr, master_port)

    def torchrun_env(self, index: int, master_addr: str, master_port: int) -> dict[str, str]:
        """torchrun's own variables, which every launcher sets."""
        return {
            "PET_MASTER_ADDR": master_addr,
            "PET_MASTER_PORT": str(master_port),
            "PET_NNODES": str(len(self.hosts)),
            "PET_NPROC_PER_NODE": self.nproc,
            "PET_NODE_RANK": str(index),
        }
