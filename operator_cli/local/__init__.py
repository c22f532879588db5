"""The local backend: ``colbert-k8s local`` replays a rendered PyTorchJob or TrainJob here, as the launcher
and kubelet would.

It is not a scheduler. It reads the manifest ``render`` produced (through ``podplan.py``) and, for the
fields it can honour, does what the Kubeflow Training Operator v1.9.4 or Trainer v2.3.0 and the
kubelet do:

* **env**: each replica gets the launcher's variables (PyTorchJob: ``MASTER_ADDR``/``PORT``,
  ``WORLD_SIZE``, ``RANK`` = pod index and ``PET_*``; TrainJob: ``PET_*`` only, the master named
  ``<job>-node-0-0.<job>`` on port 29500 under ``--isolate-network``) plus the container's own ``env``;
* **command, args, workingDir**: run as written, with mount paths mapped to local directories
  (the ConfigMap becomes a directory holding its files);
* **the workspace volume**: a PVC is shared by every pod, so it is ``--workdir`` itself. An
  ``emptyDir`` belongs to one pod: each replica gets ``--workdir/pods/<pod name>/``, which nothing
  else sees, survives restarts of the replica (as an emptyDir survives container restarts) and is
  emptied when a new ``local`` run starts (a new pod). The files the config names by relative path
  (training data, the BEIR split, a local model) are copied into each pod's workspace first, where
  the image or a data volume would have put them on a cluster; the summary says so;
* **SIGTERM**: sent to ``local`` (or to a replica) it reaches the replicas, which get the manifest's
  ``terminationGracePeriodSeconds`` to checkpoint before SIGKILL, as from the kubelet;
* **restarts**: ``restartPolicy: ExitCode`` fails the job at once on exit codes 1-127 (the trainer's
  permanent failures: config, data) and restarts on 128-255 and signals; ``OnFailure`` restarts on any
  failure; both within ``runPolicy.backoffLimit``. On a cluster the
  kubelet restarts the failed container and its peers then fail on the broken collective; here
  the replicas are restarted together, which is the same outcome without the wait for a timeout.

* **elastic PyTorchJobs** (``elasticPolicy``): every replica runs torchrun's elastic agent; a replica is
  restarted alone, and one killed with SIGKILL is a node gone for good (see :mod:`.elastic`).

Whatever it cannot honour (GPUs that are not here, node selectors, the image...) is reported in one
line. ``--isolate-network`` runs each replica in its own network namespace (see ``netns.py``).

* :mod:`.replicas`: the processes a manifest asks for (env, command, working dir);
* :mod:`.workspaces`: /workspace as a shared PVC or one emptyDir per pod;
* :mod:`.processes`: start, pump output, stop with a grace period, wait for the first failure;
* :mod:`.run`: the kubelet's restart loop and the closing summary;
* :mod:`.elastic`: an elastic job's replicas, each restarted alone or gone for good.
"""

from operator_cli.local.replicas import Replica, plan_replicas
from operator_cli.local.run import run_local

__all__ = ["Replica", "plan_replicas", "run_local"]
