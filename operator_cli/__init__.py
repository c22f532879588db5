"""colbert-k8s: render, submit and follow Kubeflow PyTorchJobs that train ColBERT models with PyLate."""

__version__ = "0.3.0"
