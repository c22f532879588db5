"""The training config's schema: one typed model for the trainer, the CLI and the Helm chart.

This module imports only pydantic, never torch, because ``colbert-k8s submit`` validates ``--config``
before anything reaches the cluster, and the chart's ``values.schema.json`` embeds :func:`json_schema`
(a test fails when they drift apart). The ``mine:`` section is ``trainer/config/mine.py``; ``index:``,
``vectordb:``, ``export:`` and ``register:`` are ``trainer/config/outputs.py``; what sections
are built of (strict models, source URLs, export destinations) ``trainer/config/base.py``; reading a YAML
file into this schema ``trainer/config/load.py``; the batch arithmetic ``trainer/scale.py``.

Example::

    model: {name_or_path: sentence-transformers/all-MiniLM-L6-v2}
    data:
      train: {path: data/train.jsonl}
    loss: {name: contrastive}
    training: {per_device_batch_size: 32, max_steps: 1000}
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import ConfigDict, Field, model_validator

from trainer.config.base import Location, Strict, parse_destination
from trainer.config.mine import MineConfig
from trainer.config.model import ModelConfig
from trainer.config.outputs import ExportConfig, IndexConfig, OnnxConfig, RegisterConfig, VectorDbConfig
from trainer.losses import LOSSES
from trainer.losses.sections import CachedContrastiveLoss, ContrastiveLoss, DistillationLoss
from trainer.retrieval import RETRIEVERS

__all__ = [
    "METRICS",
    "REMOVED_KEYS",
    "ConfigError",
    "TrainConfig",
    "json_schema",
    "ModelConfig",
    "Columns",
    "DataSource",
    "DataConfig",
    "ContrastiveLoss",
    "CachedContrastiveLoss",
    "DistillationLoss",
    "TrainingConfig",
    "CheckpointConfig",
    "EvalConfig",
    "IndexConfig",
    "OnnxConfig",
    "VectorDbConfig",
    "ExportConfig",
    "RegisterConfig",
    "TrackingConfig",
    "DistributedConfig",
]

# Keys a release took out of the schema, and which release: a config that still sets one is told so, not that
# the key is misspelt.
REMOVED_KEYS = {  # measured level or losing on every case tried (docs/mining.md, lab/two-regimes/log.md)
    "training.batch_sampler": "0.4.0",
    "training.negatives_per_row": "0.4.0",
    "training.head_only_steps": "0.4.0",
    "mine.round_start": "0.4.0",
    "loss.mask_labelled_positives": "0.5.0",
}

# The retrieval metrics evaluation reports, by key, with the name tables print (trec_eval's definitions).
METRICS = {"ndcg@10": "nDCG@10", "mrr@10": "MRR@10", "recall@100": "Recall@100", "map@100": "MAP@100"}
MetricName = Literal["ndcg@10", "mrr@10", "recall@100", "map@100"]


class ConfigError(ValueError):
    """A config problem, reported to the user as one line (never a traceback)."""


class Columns(Strict):
    """Maps the dataset's column names onto the roles the losses need."""

    query: str = "query"
    positive: str = "positive"
    negatives: list[str] = Field(default_factory=lambda: ["negative"])
    documents: str = Field("documents", description="Distillation: list of candidate documents.")
    scores: str = Field("scores", description="Distillation: teacher scores, one per document.")


class DataSource(Strict):
    path: Location = Field(
        ...,
        min_length=1,
        description="A .jsonl/.json, .parquet or .csv file or a `datasets.save_to_disk` directory: a local path, "
        "an s3:// (gs://, az://) or https:// URL (staged into data.cache_dir), or hf://datasets/ORG/NAME.",
    )
    split: str | None = Field(None, description="Hub datasets: the split to train on (default train).")
    columns: Columns = Field(default_factory=Columns)
    limit: int | None = Field(None, ge=1, description="Use only the first N rows.")

    def pairs(self) -> DataSource:
        """This source read as (query, positive) pairs: its negative columns ignored (mining's input)."""
        return self.model_copy(update={"columns": self.columns.model_copy(update={"negatives": []})})


class DataConfig(Strict):
    train: DataSource
    eval_beir: Location | None = Field(
        None,
        description="A BEIR directory (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) for nDCG@10, "
        "or an object-store prefix holding one.",
    )
    eval_split: str = "test"
    cache_dir: str = Field(
        ".cache/colbert-k8s",
        min_length=1,
        description="Staged sources and the Arrow copy of the training data (relative: under /workspace).",
    )
    num_workers: int = Field(1, ge=0, le=32, description="DataLoader workers tokenising batches ahead of the step.")
    pretokenize: bool = Field(False, description="Tokenise every row before step 1 (small sets only).")


# A section per loss, chosen by ``name``: the classes the loss registry lists (trainer/losses/__init__.py).
LossConfig = Annotated[Union[tuple(LOSSES.values())], Field(discriminator="name")]  # noqa: UP007 (a runtime tuple)


class TrainingConfig(Strict):
    per_device_batch_size: int = Field(16, ge=1, description="Queries per process per optimizer step.")
    global_batch_size: int | None = Field(
        None,
        ge=1,
        description="Queries per optimizer step on any world size (elastic jobs): each process then takes "
        "global / world size of them, and a checkpoint resumes on another world size. For contrastive losses "
        "it is the group of in-batch negatives, so it must divide by the world size (per_device_batch_size "
        "is then unused); for distillation per_device_batch_size caps a micro-batch and accumulation fills "
        "the rest.",
    )
    learning_rate: float = Field(3e-5, gt=0, lt=1)
    head_learning_rate: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="The learning rate of the layers after the encoder (the ColBERT projection, which starts "
        "random on a base that is not a ColBERT), as sentence-transformers' learning_rate_mapping sets one "
        "per module: the encoder starts trained, the projection does not. Default: training.learning_rate.",
    )
    weight_decay: float = Field(0.0, ge=0, description="Not applied to biases and LayerNorm weights.")
    epochs: float | None = Field(1.0, gt=0, description="Ignored when max_steps is set.")
    max_steps: int | None = Field(None, ge=1)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    lr_scheduler: Literal["linear", "cosine", "constant_with_warmup"] = Field(
        "linear", description="transformers.get_scheduler's schedule after the warm-up."
    )
    gradient_accumulation_steps: int = Field(
        1,
        ge=1,
        le=1024,
        description="Micro-batches per optimizer step; the gradient equals the A-times-larger batch's "
        "(for distillation; contrastive losses draw in-batch negatives per micro-batch: use cached-contrastive).",
    )
    max_grad_norm: float | None = Field(1.0, gt=0, description="Clipped on the global-batch gradient.")
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    skip_nonfinite_steps: int = Field(
        0,
        ge=0,
        description="Steps whose gradient is NaN or infinite to skip (each logged, no update) before the job "
        "stops with exit code 2 naming the step. Default 0: the first one stops it.",
    )
    compile: bool = Field(
        False, description="torch.compile the encoder (the first steps then pay for compiling). Off until measured."
    )
    tf32: bool = Field(
        True, description="TF32 matrix multiplies on CUDA GPUs that have them (Ampere or newer); no effect on CPU."
    )
    seed: int = 42
    gather_across_devices: bool | None = Field(
        None, description="In-batch negatives from every rank; default on when the world size is > 1."
    )
    log_every: int = Field(10, ge=1)


class CheckpointConfig(Strict):
    every_steps: int = Field(100, ge=1, description="Steps between checkpoints (the most work a crash loses).")
    keep_last: int = Field(2, ge=1)
    resume: bool = Field(True, description="Resume from the newest complete checkpoint in output_dir.")


class EvalConfig(Strict):
    before_training: bool = False
    after_training: bool = True
    every_steps: int | None = Field(
        None, ge=1, description="Also evaluate every N steps; the best model by `metric` is kept as best-model."
    )
    metric: MetricName = "ndcg@10"
    batch_size: int = Field(32, ge=1)


class TrackingConfig(Strict):
    report_to: list[Literal["jsonl", "tensorboard", "mlflow", "wandb"]] = Field(
        default_factory=lambda: ["jsonl", "tensorboard"],
        description="metrics.jsonl and TensorBoard events in output_dir; MLflow / W&B read their settings "
        "and credentials from the environment (--secret-env).",
    )
    run_name: str | None = Field(None, description="The run's name in MLflow / W&B (default: output_dir's name).")


class DistributedConfig(Strict):
    timeout_seconds: int = Field(
        1800, ge=10, description="Process-group timeout for every collective (a healthy slow step must fit)."
    )
    peer_timeout_seconds: int = Field(
        60,
        ge=5,
        le=3600,
        description="A peer whose heartbeat stops this long is taken for dead; the survivors exit to be restarted.",
    )
    find_unused_parameters: bool = Field(
        False,
        description="DDP's find_unused_parameters: on when some trainable weights get no gradient in a step "
        "(a custom model); costs a graph traversal per step.",
    )


# The cross-field rules of TrainConfig._check (and MineConfig._check) that JSON Schema can state, for the chart's
# values.schema.json (a Helm user gets the same refusal as the CLI; tests/test_chart.py checks both).
_CROSS_FIELD_SCHEMA: dict[str, Any] = {
    "allOf": [
        {  # "set training.max_steps or training.epochs"
            "not": {
                "required": ["training"],
                "properties": {
                    "training": {
                        "required": ["epochs"],
                        "properties": {"epochs": {"type": "null"}, "max_steps": {"type": "null"}},
                    }
                },
            }
        },
        *(
            {  # "evaluation.<key> needs data.eval_beir"
                "if": {
                    "required": ["evaluation"],
                    "properties": {
                        "evaluation": {"required": [key], "properties": {key: {"not": {"enum": [None, False]}}}}
                    },
                },
                "then": {
                    "properties": {"data": {"required": ["eval_beir"], "properties": {"eval_beir": {"type": "string"}}}}
                },
            }
            for key in ("before_training", "every_steps")
        ),
        {  # "mine.model is set but mine.retriever is bm25" (MineConfig._check)
            "not": {
                "required": ["mine"],
                "properties": {
                    "mine": {
                        "required": ["retriever", "model"],
                        "properties": {
                            "retriever": {"enum": [k for k, r in RETRIEVERS.items() if not r.needs_model]},
                            "model": {"type": "string"},
                        },
                    }
                },
            }
        },
    ]
}


class TrainConfig(Strict):
    """The whole training job, as written in ``train.yaml``."""

    model_config = ConfigDict(**Strict.model_config, json_schema_extra=_CROSS_FIELD_SCHEMA)

    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig
    loss: LossConfig = Field(default_factory=ContrastiveLoss)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    evaluation: EvalConfig = Field(default_factory=EvalConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    index: IndexConfig | None = Field(
        None, description="Build a PLAID index with the trained model at the end and evaluate through it."
    )
    mine: MineConfig | None = Field(
        None, description="Mine hard negatives for data.train's (query, positive) pairs before training."
    )
    export: ExportConfig | None = Field(
        None, description="Upload the final model, its card and metrics.json when the job ends (S3, GCS, Azure, Hub)."
    )
    vectordb: VectorDbConfig | None = Field(
        None, description="Write the corpus, encoded by the trained model, into a vector database (Qdrant, LanceDB)."
    )
    onnx: OnnxConfig | None = Field(
        None,
        description="Write the encoder in ONNX (float32 and int8) beside the final model, with its parity against "
        "PyTorch on the held-out split, for `serve --onnx`.",
    )
    registration: RegisterConfig | None = Field(  # `register` in YAML: the field name would shadow BaseModel's
        None,
        alias="register",
        description="Register the export in the Kubeflow Model Registry once it is verified (needs export).",
    )
    output_dir: str = Field("output", min_length=1, description="Checkpoints, final model, metrics.json.")

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if self.training.max_steps is None and self.training.epochs is None:
            raise ValueError("set training.max_steps or training.epochs")
        if self.evaluation.before_training and not self.data.eval_beir:
            raise ValueError("evaluation.before_training needs data.eval_beir")
        if self.evaluation.every_steps and not self.data.eval_beir:
            raise ValueError("evaluation.every_steps needs data.eval_beir")
        if self.index is not None and not (self.index.corpus or self.data.eval_beir):
            raise ValueError("index needs index.corpus or data.eval_beir (a BEIR directory)")
        if self.vectordb is not None and not ((self.index and self.index.corpus) or self.data.eval_beir):
            raise ValueError("vectordb needs a corpus: index.corpus or data.eval_beir (a BEIR directory)")
        if self.training.global_batch_size is not None and self.training.gradient_accumulation_steps != 1:
            raise ValueError(
                "training.global_batch_size derives the accumulation steps itself: remove "
                "training.gradient_accumulation_steps"
            )
        if (
            self.training.global_batch_size is not None
            and self.training.gather_across_devices is False
            and not self.loss.scored
        ):
            raise ValueError(
                "training.global_batch_size (an elastic job) with gather_across_devices: false draws each query's "
                "in-batch negatives from its own rank only, so the loss changes with the world size; remove "
                "training.gather_across_devices, or unset global_batch_size"
            )
        if getattr(self.loss, "temperature", None) == "auto" and self.mine is None:
            raise ValueError(
                "loss.temperature: auto is chosen from how the mining retriever ranks the labelled positives; "
                "add a mine: section, or set a number (PyLate's default is 1)"
            )
        if self.mine is not None and self.mine.teacher is None and self.loss.scored:
            raise ValueError(f"loss {self.loss.name} with mine needs mine.teacher to score the mined documents")
        if self.mine is not None and self.mine.teacher is not None and not self.loss.scored:
            scored = " | ".join(k for k, loss in LOSSES.items() if loss.scored)
            raise ValueError(
                f"mine.teacher writes teacher scores for loss: {{name: {scored}}}; set it, or remove mine.teacher"
            )
        self._check_export()
        if self.registration is not None and self.export is None:
            raise ValueError("register needs an export section: the registered version points at the export")
        return self

    def _check_export(self) -> None:
        if self.export is None:
            return
        hub = parse_destination(self.export.destination).hub
        if not hub and (self.export.revision or self.export.private or self.export.replace):
            raise ValueError(
                "export.revision, export.private and export.replace apply to hf:// destinations only; remove them"
            )
        if "index" in self.export.include and self.index is None:
            raise ValueError("export.include: index needs an index section (nothing else builds one)")
        if "best-model" in self.export.include and not self.evaluation.every_steps:
            raise ValueError("export.include: best-model needs evaluation.every_steps (nothing else keeps one)")


def json_schema(ref_template: str = "#/$defs/{model}") -> dict[str, Any]:
    """The JSON schema of :class:`TrainConfig`, embedded in the chart's values.schema.json
    (which passes a ``ref_template`` that keeps its definitions apart from the chart's own)."""
    return TrainConfig.model_json_schema(ref_template=ref_template)
