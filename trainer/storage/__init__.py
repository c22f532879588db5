"""Where a job's bytes come from and where they go: staged in before training, shipped out after.

One room because each module moves a model or data across the pod's edge, through one reading of the
environment for object stores (``stores.py``), and none of them trains: the run itself (``trainer/run/``)
never imports from here.

* ``sources.py``: remote data and models (object stores, the Hub, HTTPS) staged into the pod, once;
* ``stores.py``: an obstore store for a bucket, configured from the environment;
* ``export.py``: the trained model out to an object store or a Hub repository (its uploaders are
  ``trainer/destinations/``, one per URL scheme);
* ``card.py``: the model card the final model carries, so a model found later says what it is.

Files written whole or not at all are ``trainer/atomic.py``, beside ``errors.py``: checkpoints, mining and
the index write through it too, so it is a floor under this room and ``trainer/run/``, not part of either.
"""
