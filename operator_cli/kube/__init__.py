"""The cluster backend: everything that talks to the Kubernetes API, through the official ``kubernetes`` client.

* :mod:`.transport`: kubeconfig, timeouts, urllib3 retries for reads, errors as one line;
* :mod:`.kinds`: the job kinds (PyTorchJob v1, TrainJob v2), one :class:`JobKind` each, and a job's state;
* :mod:`.names`: the names derived from a job's (its ConfigMap, its claim, its pods);
* :mod:`.pods`: a job's pods and what is wrong with them;
* :mod:`.cluster`: :class:`Cluster`, the operations every command uses on one namespace;
* :mod:`.runtime`: this image's ClusterTrainingRuntime (``runtime render|install``) and its failure policy;
* :mod:`.fetch`: ``fetch``, a finished job's outputs copied off its claim by a read-only pod of its own;
  :mod:`.archive`: the tar streamed out of that pod over exec, extracted without trusting it;
* :mod:`.upload`: ``upload``, local data streamed onto a job's claim through the same pod, writing.

The local backend, which replays a rendered job without a cluster, is :mod:`operator_cli.local`.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Cluster", "JobKind", "KINDS", "PodInfo", "connect", "default_namespace", "job_state", "kind_of", "redact"]

# Each public name and the module that defines it, imported when the name is first asked: importing
# ``operator_cli.kube.names`` (as ``render`` does through the kinds) must not load ``cluster``, which imports
# ``render``. The project's own modules import from the defining module; this face is for library users.
_LAZY = {
    "Cluster": "cluster",
    "JobKind": "kinds",
    "KINDS": "kinds",
    "job_state": "kinds",
    "kind_of": "kinds",
    "PodInfo": "pods",
    "connect": "transport",
    "default_namespace": "transport",
    "redact": "transport",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
