"""What a run tells the world outside its pod while it trains.

One room because each module only reports: the run trains the same whatever they write, and none of
them is read back by the run.

* ``progress.py``: one progress for the whole job (every phase, in the order it runs), for the
  TrainJob's status and one structured log line;
* ``tracking.py``: scalars to ``metrics.jsonl``, TensorBoard, MLflow or Weights & Biases;
* ``metrics_file.py``: the JSON lines a sweep's metrics collector (Katib's File collector) reads.
"""
