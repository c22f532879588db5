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

from operator_cli.kube.cluster import Cluster
from operator_cli.kube.kinds import KINDS, JobKind, job_state, kind_of
from operator_cli.kube.pods import PodInfo
from operator_cli.kube.transport import connect, default_namespace, redact

__all__ = ["Cluster", "JobKind", "KINDS", "PodInfo", "connect", "default_namespace", "job_state", "kind_of", "redact"]
