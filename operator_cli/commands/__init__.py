"""The ``colbert-k8s`` commands, one module per area; :mod:`operator_cli.cli` puts them in one group.

* :mod:`.base`: the group and command classes (one-line errors, a flag given twice refused) and the options
  every cluster command shares;
* :mod:`.job`: ``render``, ``submit`` and ``local``: the job's options (:data:`operator_cli.spec.JOB_OPTIONS`)
  become a :class:`operator_cli.spec.JobSpec`, and the spec its objects;
* :mod:`.read`: ``status``, ``logs``, ``list``, ``doctor`` and ``fetch``;
* :mod:`.change`: ``resize``, ``delete``, ``suspend`` and ``resume``;
* :mod:`.runtime`: ``runtime render|install``;
* :mod:`.upload`: ``upload``, local data onto a job's claim;
* :mod:`.export_index`: ``export-index``, an exported model's corpus into a vector database;
* :mod:`.export_onnx`: ``export-onnx``, a model's encoder in ONNX beside it, checked against PyTorch.
"""
