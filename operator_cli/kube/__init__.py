"""The cluster backend: everything that talks to the Kubernetes API, through the official ``kubernetes`` client.

* :mod:`.transport`: kubeconfig, timeouts, urllib3 retries for reads, errors as one line;
* :mod:`.kinds`: the two job APIs (PyTorchJob v1, TrainJob v2) and a job's state;
* :mod:`.pods`: a job's pods and what is wrong with them;
* :mod:`.cluster`: :class:`Cluster`, the operations ``submit``, ``status``, ``logs``, ``list`` and
  ``delete`` use on one namespace.
* :mod:`.fetch`: ``fetch``, a finished job's outputs copied off its claim by a read-only pod of its own;
  :mod:`.archive`: the tar streamed out of that pod over exec, extracted without trusting it.

The local backend, which replays a rendered job without a cluster, is :mod:`operator_cli.local`.
"""

from operator_cli.kube.cluster import Cluster
from operator_cli.kube.kinds import KINDS, JobKind, job_state, kind_of
from operator_cli.kube.pods import PodInfo
from operator_cli.kube.transport import connect, default_namespace, redact

__all__ = ["Cluster", "JobKind", "KINDS", "PodInfo", "connect", "default_namespace", "job_state", "kind_of", "redact"]
