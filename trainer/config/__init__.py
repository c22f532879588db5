"""The training config: what a job may ask for, read and checked before anything else runs.

One room because every part answers the same question (is this config one the trainer can run?) and is
read by the same three readers: the trainer at start, ``colbert-k8s`` before anything reaches the cluster,
and the Helm chart's ``values.schema.json``. None of it imports torch; this ``__init__`` imports nothing, so
the CLI reads :mod:`~trainer.config.credentials` (standard library) without pydantic.

* ``schema.py``: the typed model, :class:`~trainer.config.schema.TrainConfig`, and its cross-field rules;
* ``mine.py``: the ``mine:`` section (mining and its teacher);
* ``base.py``: what sections are built of (strict models, source URLs, export destinations);
* ``load.py``: a file of bounded YAML read into the schema, every problem one line;
* ``overrides.py``: ``--set KEY=VALUE``, one key changed from the command line;
* ``credentials.py``: the one pattern of a credential value, refused in every string of a config.
"""
