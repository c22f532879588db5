"""The names derived from a job's name, in one place: what the templates write, and what ``delete``,
``resize`` and ``fetch`` look for on the cluster later.

>>> config_map("demo"), created_claim("demo"), pod("demo", "worker-3")
('demo-config', 'demo-workspace', 'demo-worker-3')
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["JobNames", "config_map", "created_claim", "fetch_pod", "pod"]


def config_map(job: str) -> str:
    """The ConfigMap holding the job's training config (``train.yaml``)."""
    return f"{job}-config"


def created_claim(job: str) -> str:
    """The PersistentVolumeClaim ``--pvc-size`` creates for the job's /workspace (``--pvc`` names its own)."""
    return f"{job}-workspace"


def pod(job: str, replica: str) -> str:
    """A pod's host name: ``<job>-<replica>`` (``master-0``, ``worker-2``, ``node-0-1``), as controllers name them."""
    return f"{job}-{replica}"


def fetch_pod(job: str, token: str, component: str = "fetch") -> str:
    """``fetch``'s (or ``upload``'s) own pod: the job's name cut to leave room for the suffix within 63 characters.

    >>> fetch_pod("a" * 60, "abc123"), fetch_pod("demo", "abc123", "upload")
    ('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-fetch-abc123', 'demo-upload-abc123')
    """
    return f"{job[:40]}-{component}-{token}"


@dataclass(frozen=True)
class JobNames:
    """The names of one job's objects, as the templates read them (``names.config_map``, ``names.claim``)."""

    job: str
    claim: str | None  # the claim mounted at /workspace: --pvc, the one --pvc-size creates, or None (emptyDir)
    pods: tuple[str, ...] = ()  # host names in node-rank order (the job's kind decides them)

    @property
    def config_map(self) -> str:
        return config_map(self.job)
