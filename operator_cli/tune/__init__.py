"""``colbert-k8s tune``: a sweep whose trials are jobs (a trial is exactly a job), on three engines, one spec.

* :mod:`.space`: ``--param KEY=SPACE``, a search space, sampled by seed and trial index;
* :mod:`.spec`: :class:`SweepSpec`, the trial job, the space, the objective and the budget, checked on
  construction (the schema, the metric, the test split) before anything starts;
* :mod:`.local`: the local engine: trials replayed as ``colbert-k8s local`` does, resumable;
  :mod:`.trial`: one trial's process;
* :mod:`.record`: what ``tune status`` shows, read from the trials' own ``metrics.json``;
* :mod:`.best`: the best trial's model exported with a card naming the sweep;
* :mod:`.cluster`: a sweep on a cluster (Katib Experiment, Trainer OptimizationJob: the kinds are
  :data:`operator_cli.kube.kinds.SWEEPS`): status, list, delete;
* :mod:`.options`: the sweep's own options.
"""
