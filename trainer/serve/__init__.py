"""Serving a trained model: KServe's predictor (search, rerank), its engine, and registration.

* ``requests.py``: what a client may ask (v1 and v2 shapes), checked, standard library only;
* ``engine.py``: the model and its corpus (PLAID index or stored embeddings), torch and PyLate;
* ``corpus.py``: the corpus embeddings the index phase stores for exact MaxSim;
* ``plaid.py``: the job's PLAID index held in memory, its document ids loaded once;
* ``predictor.py``: the KServe model server around the engine (the ``serve`` extra, ``.venv-serve``);
* ``registry.py``, ``register.py``: the Kubeflow Model Registry's REST API, and registering an export in it.

Importing this package imports neither torch nor kserve.
"""

from trainer.config.schema import ConfigError

__all__ = ["ServeError"]


class ServeError(ConfigError):
    """What ``serve`` was given cannot be served: one line naming the fix (exit 2)."""
