"""colbert-k8s: render, submit and follow the Kubeflow jobs that train ColBERT models with PyLate (a
PyTorchJob of Training Operator v1 or a TrainJob of Trainer v2, chosen by ``--api``), replay them on this
machine (``local``), sweep their settings (``tune``: a Katib Experiment or an OptimizationJob), and serve
and register what they export (``serve``: a KServe InferenceService; ``register``). Each job kind is a
class in ``kube/kinds/``; the command-line interface imports no torch."""

__version__ = "0.4.0"
