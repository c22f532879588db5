"""The training config: one typed schema for the trainer, the CLI and the Helm chart.

This module imports only pydantic and PyYAML, never torch, because ``colbert-k8s submit``
validates ``--config`` before anything reaches the cluster, and the chart's
``values.schema.json`` embeds :func:`json_schema` (a test fails when they drift apart).

Example::

    model: {name_or_path: sentence-transformers/all-MiniLM-L6-v2}
    data:
      train: {path: data/train.jsonl}
    loss: {name: contrastive}
    training: {per_device_batch_size: 32, max_steps: 1000}
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from trainer.credentials import credential_in

__all__ = [
    "METRICS",
    "ConfigError",
    "TrainConfig",
    "load_config",
    "parse_config",
    "json_schema",
    "read_config_text",
    "load_yaml",
    "Scale",
    "job_scale",
    "micro_batches",
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
    "TrackingConfig",
    "DistributedConfig",
    "MineConfig",
    "TeacherConfig",
]

# The retrieval metrics evaluation reports, by key, with the name tables print (trec_eval's definitions).
METRICS = {"ndcg@10": "nDCG@10", "mrr@10": "MRR@10", "recall@100": "Recall@100", "map@100": "MAP@100"}
MetricName = Literal["ndcg@10", "mrr@10", "recall@100", "map@100"]

MAX_CONFIG_BYTES = 1 << 20  # a training config is a page of YAML; a megabyte is already suspicious
MAX_DEPTH = 24
MAX_INT_DIGITS = 30


class ConfigError(ValueError):
    """A config problem, reported to the user as one line (never a traceback)."""


# Where a source may live besides a local path: staged by trainer/sources.py (hf:// goes to the hub's client)
OBJECT_SCHEMES = ("s3", "gs", "az", "abfs", "http", "https")


def _location(value: str) -> str:
    """A local path, or a URL trainer/sources.py can stage: checked here, so that ``render`` refuses it
    too, instead of the pod failing at start."""
    if "://" not in value:
        return value
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (parses the port: "host:http" raises here)
    except ValueError as e:
        raise ValueError(f"is not a valid URL ({e})") from None
    if parts.scheme == "hf":
        if not (parts.netloc + parts.path).strip("/"):
            raise ValueError("hf:// names no repository; give hf://ORG/NAME (models) or hf://datasets/ORG/NAME")
        return value
    if parts.scheme not in OBJECT_SCHEMES:
        raise ValueError(
            f"{parts.scheme}:// is not a source this trainer can fetch; use a local path, "
            f"{', '.join(s + '://' for s in OBJECT_SCHEMES)} or hf://"
        )
    host = parts.hostname or ""
    if not host:
        raise ValueError(f"{parts.scheme}:// names no {'host' if parts.scheme.startswith('http') else 'bucket'}")
    if re.fullmatch(r"[0-9.]+", host):  # all digits and dots: URL parsers read it as an IPv4 address
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"host {host} is not an IPv4 address") from None
    return value


Location = Annotated[str, AfterValidator(_location)]


class _Strict(BaseModel):
    """Unknown keys are refused: a typo must not silently fall back to a default."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class ModelConfig(_Strict):
    name_or_path: Location = Field(
        "sentence-transformers/all-MiniLM-L6-v2",
        min_length=1,
        description="A local model directory, an object-store prefix (s3://bucket/model/, staged like data), "
        "or a hub name (needs network access).",
    )
    query_length: int = Field(32, ge=4, le=8192, description="Query tokens, incl. [Q] marker and expansion.")
    document_length: int = Field(180, ge=8, le=8192, description="Maximum document tokens.")
    embedding_size: int | None = Field(
        None,
        ge=8,
        le=4096,
        description="Size of a new ColBERT projection (PyLate's default 128); unset keeps a model's own.",
    )
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = Field(
        None,
        description="transformers' attention kernel: eager, sdpa (fused, PyTorch's own), or flash_attention_2 "
        "(CUDA, needs the flash-attn package and bf16/fp16). Unset: transformers' default for the model.",
    )


class Columns(_Strict):
    """Maps the dataset's column names onto the roles the losses need."""

    query: str = "query"
    positive: str = "positive"
    negatives: list[str] = Field(default_factory=lambda: ["negative"])
    documents: str = Field("documents", description="Distillation: list of candidate documents.")
    scores: str = Field("scores", description="Distillation: teacher scores, one per document.")


class DataSource(_Strict):
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


class DataConfig(_Strict):
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


class ContrastiveLoss(_Strict):
    name: Literal["contrastive"] = "contrastive"
    temperature: float = Field(1.0, gt=0, description="Scores are divided by this before the softmax.")
    mask_labelled_positives: bool = Field(
        False,
        description="Leave out of each query's in-batch negatives every document data.train labels relevant to "
        "it (another row's positive of the same query, or of a query with the same text): on data with many "
        "positives per query these are not negatives (trainer/data/labelled.py).",
    )


class CachedContrastiveLoss(_Strict):
    name: Literal["cached-contrastive"]
    temperature: float = Field(1.0, gt=0)
    mini_batch_size: int = Field(8, ge=1, description="Texts encoded at once; bounds activation memory.")


class DistillationLoss(_Strict):
    name: Literal["distillation"]
    normalize_scores: bool = Field(True, description="Teacher scores are softmax-normalised before KL.")


LossConfig = Annotated[ContrastiveLoss | CachedContrastiveLoss | DistillationLoss, Field(discriminator="name")]


class TrainingConfig(_Strict):
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


class CheckpointConfig(_Strict):
    every_steps: int = Field(100, ge=1, description="Steps between checkpoints (the most work a crash loses).")
    keep_last: int = Field(2, ge=1)
    resume: bool = Field(True, description="Resume from the newest complete checkpoint in output_dir.")


class EvalConfig(_Strict):
    before_training: bool = False
    after_training: bool = True
    every_steps: int | None = Field(
        None, ge=1, description="Also evaluate every N steps; the best model by `metric` is kept as best-model."
    )
    metric: MetricName = "ndcg@10"
    batch_size: int = Field(32, ge=1)


class IndexConfig(_Strict):
    corpus: str | None = Field(None, description="A BEIR directory to index (default data.eval_beir).")
    nbits: int = Field(4, ge=1, le=8, description="PLAID residual compression bits.")


def _destination(value: str) -> str:
    from trainer.export import parse_destination  # stdlib only at import: the CLI checks it without torch

    parse_destination(value)
    return value


class ExportConfig(_Strict):
    """Where the trained model goes when the job ends (``trainer/export.py``)."""

    destination: Annotated[str, AfterValidator(_destination)] = Field(
        description="s3://BUCKET/PREFIX/ (gs://, az:// alike) or hf://ORG/NAME (a Hub model repository). The "
        "final model (with its card), metrics.json and a manifest go there; credentials come from the environment.",
        json_schema_extra={"pattern": r"^((s3|gs|az)://[^/@?#\s]+(/[^@?#\s]*)?|hf://[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*/?)$"},
    )
    include: list[Literal["best-model", "index", "checkpoint"]] = Field(
        default_factory=list, description="Also export these: best-model, the PLAID index, the last checkpoint."
    )
    revision: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,99}$", description="hf:// only: the branch to commit to."
    )
    private: bool = Field(False, description="hf:// only: create the repository private when it does not exist.")


class TrackingConfig(_Strict):
    report_to: list[Literal["jsonl", "tensorboard", "mlflow", "wandb"]] = Field(
        default_factory=lambda: ["jsonl", "tensorboard"],
        description="metrics.jsonl and TensorBoard events in output_dir; MLflow / W&B read their settings "
        "and credentials from the environment (--secret-env).",
    )
    run_name: str | None = Field(None, description="The run's name in MLflow / W&B (default: output_dir's name).")


class DistributedConfig(_Strict):
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


class TeacherConfig(_Strict):
    """A model that scores each mined row's documents for distillation (``trainer/teacher.py``)."""

    name_or_path: Location = Field(
        ...,
        min_length=1,
        description="A local directory (or object-store prefix) holding a sentence-transformers CrossEncoder "
        "or a PyLate ColBERT model.",
    )
    batch_size: int = Field(32, ge=1, description="(query, document) pairs per forward pass.")
    max_length: int = Field(256, ge=8, le=8192, description="Cross-encoder tokens per (query, document) pair.")


class MineConfig(_Strict):
    """Hard negatives mined before training: retrieve the top-k of a corpus for every query, drop the
    positives and likely false negatives, sample ``negatives`` from a rank range (``trainer/mine.py``)."""

    corpus: Location | None = Field(
        None,
        description="The documents to mine from: a .jsonl with a `text` (and optional `title`) per line, or a "
        "BEIR directory (its corpus.jsonl). Default: every distinct positive of data.train.",
    )
    retriever: Literal["model", "plaid", "bm25"] = Field(
        "model",
        description="First round: exact MaxSim with model.name_or_path, sharded over all ranks; plaid: the same "
        "model through a PLAID index of each rank's share (corpora beyond ~1M documents on GPUs, ~10k on CPUs: "
        "docs/mining.md); or BM25 (bm25s). "
        "Later rounds mine with the model trained in the round before, through PLAID if it is plaid.",
    )
    model: Location | None = Field(
        None,
        min_length=1,
        description="The ColBERT model the first round retrieves with (retriever: model or plaid), when it is not "
        "model.name_or_path: a model trained before on the same data, or a stronger one. Training still starts "
        "from model.name_or_path. Default: model.name_or_path.",
    )
    nbits: int = Field(4, ge=1, le=8, description="PLAID residual compression bits (retriever: plaid).")
    top_k: int = Field(100, ge=1, le=1000, description="Documents retrieved per query.")
    rank_range: list[int] = Field(
        default_factory=lambda: [3, 30],
        min_length=2,
        max_length=2,
        description="Sample negatives from these ranks (1-based, inclusive) of the top_k, counted after the "
        "query's positives and the candidates above max_score_ratio are removed: the first few left are still "
        "often unlabelled positives.",
    )
    max_score_ratio: float = Field(
        0.95,
        gt=0,
        le=1,
        description="Skip a candidate scoring above this fraction of the positive's score (a likely false "
        "negative), as sentence-transformers' mine_hard_negatives does with its relative margin.",
    )
    margin: float | None = Field(
        None,
        ge=0,
        description="Also skip a candidate scoring above the positive's score minus this (an absolute margin, "
        "sentence-transformers' absolute_margin). Default: none.",
    )
    min_score: float | None = Field(
        None, description="Skip a candidate scoring below this (too easy to teach anything). Default: none."
    )
    sampling: Literal["random", "top"] = Field(
        "random",
        description="random: a seeded sample of the rank range; top: its first `negatives` (the hardest left, "
        "NV-Retriever's TopK-PercPos).",
    )
    positive_within: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="Drop a row whose positive the retriever ranks below this (consistency filtering, as in "
        "GTR and Promptagator): a pair the model cannot find among its top documents is often vague or "
        "mislabelled. Default: keep every row.",
    )
    negatives: int = Field(3, ge=1, le=64, description="Negatives per (query, positive) row.")
    rows_per_query: int | None = Field(
        None,
        ge=1,
        description="Keep at most this many rows per distinct query (a seeded sample of its rows); every "
        "positive of data.train still counts as the query's positive, so none becomes a negative. For data "
        "with many positives per query (NFCorpus: 43 on average). Default: every row.",
    )
    rounds: int = Field(
        1,
        ge=1,
        le=10,
        description="Mine then train, N times: each round after the first mines with the model the round "
        "before trained, then trains model.name_or_path again on the new negatives.",
    )
    batch_size: int = Field(64, ge=1, description="Texts per forward pass while encoding.")
    teacher: TeacherConfig | None = Field(
        None,
        description="Score each row's positive and negatives with this model and write distillation rows "
        "(query, documents, scores); needs loss: {name: distillation}.",
    )
    query_chunk: int = Field(2048, ge=1, description="Queries per resumable part of the mined rows.")

    @model_validator(mode="after")
    def _check(self) -> MineConfig:
        low, high = self.rank_range
        if not 1 <= low <= high:
            raise ValueError(f"mine.rank_range must be [low, high] with 1 <= low <= high, got [{low}, {high}]")
        if high > self.top_k:
            raise ValueError(
                f"mine.rank_range ends at rank {high} but mine.top_k retrieves only {self.top_k} documents; "
                f"raise mine.top_k to at least {high} or lower the range"
            )
        if self.model is not None and self.retriever == "bm25":
            raise ValueError(
                f"mine.model {self.model} is set but mine.retriever is bm25, which uses no model; "
                "set mine.retriever: model (or plaid), or remove mine.model"
            )
        if self.positive_within is not None and self.positive_within > self.top_k:
            raise ValueError(
                f"mine.positive_within {self.positive_within} is beyond mine.top_k {self.top_k}: the retriever "
                f"ranks only that many; raise mine.top_k or lower mine.positive_within"
            )
        if high - low + 1 < self.negatives:
            raise ValueError(
                f"mine.rank_range [{low}, {high}] holds {high - low + 1} ranks, fewer than mine.negatives "
                f"({self.negatives}); widen the range or ask for fewer negatives"
            )
        return self


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
                        "properties": {"retriever": {"const": "bm25"}, "model": {"type": "string"}},
                    }
                },
            }
        },
    ]
}


class TrainConfig(_Strict):
    """The whole training job, as written in ``train.yaml``."""

    model_config = ConfigDict(**_Strict.model_config, json_schema_extra=_CROSS_FIELD_SCHEMA)

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
        if self.training.global_batch_size is not None and self.training.gradient_accumulation_steps != 1:
            raise ValueError(
                "training.global_batch_size derives the accumulation steps itself: remove "
                "training.gradient_accumulation_steps"
            )
        if (
            self.training.global_batch_size is not None
            and self.training.gather_across_devices is False
            and self.loss.name != "distillation"
        ):
            raise ValueError(
                "training.global_batch_size (an elastic job) with gather_across_devices: false draws each query's "
                "in-batch negatives from its own rank only, so the loss changes with the world size; remove "
                "training.gather_across_devices, or unset global_batch_size"
            )
        if self.mine is not None and self.mine.teacher is None and self.loss.name == "distillation":
            raise ValueError("loss distillation with mine needs mine.teacher to score the mined documents")
        if self.mine is not None and self.mine.teacher is not None and self.loss.name != "distillation":
            raise ValueError(
                "mine.teacher writes teacher scores for loss: {name: distillation}; set it, or remove mine.teacher"
            )
        self._check_export()
        return self

    def _check_export(self) -> None:
        if self.export is None:
            return
        hub = self.export.destination.startswith("hf://")
        if not hub and (self.export.revision or self.export.private):
            raise ValueError("export.revision and export.private apply to hf:// destinations only; remove them")
        if "index" in self.export.include and self.index is None:
            raise ValueError("export.include: index needs an index section (nothing else builds one)")
        if "best-model" in self.export.include and not self.evaluation.every_steps:
            raise ValueError("export.include: best-model needs evaluation.every_steps (nothing else keeps one)")


@dataclass(frozen=True)
class Scale:
    """How big a step is: computed once, printed identically by ``render``/``submit`` and the trainer."""

    world_size: int
    per_device: int
    accumulation: int
    docs_per_query: int  # positive + negatives of a row (contrastive losses)
    gather: bool
    loss: str

    @property
    def global_batch(self) -> int:
        """Queries per optimizer step."""
        return self.world_size * self.per_device * self.accumulation

    @property
    def negatives_per_query(self) -> int:
        """Documents each query is scored against besides its positive (0 for distillation).

        Contrastive losses draw them from one micro-batch (across ranks when gathering), never
        across accumulation micro-batches: accumulation grows the global batch, not the negatives."""
        if self.loss == "distillation":
            return 0
        return self.per_device * (self.world_size if self.gather else 1) * self.docs_per_query - 1

    def line(self) -> str:
        return (
            f"world size {self.world_size} x per-device batch {self.per_device} x accumulation "
            f"{self.accumulation} = global batch {self.global_batch}; in-batch negatives per query "
            f"{self.negatives_per_query} ({'gathered across ranks' if self.gather else 'this rank only'}, "
            f"per micro-batch; loss {self.loss})"
        )


def _split(global_batch: int, world_size: int, cap: int) -> tuple[int, int] | None:
    """(micro-batch, accumulation) with the fewest micro-batches of at most ``cap`` that cover the
    global batch exactly on ``world_size`` processes; None when there is none."""
    if global_batch % world_size:
        return None
    share = global_batch // world_size  # each process's queries per step
    for accumulation in range(1, share + 1):
        if share % accumulation == 0 and share // accumulation <= cap:
            return share // accumulation, accumulation
    return None


def micro_batches(cfg: TrainConfig, world_size: int) -> tuple[int, int]:
    """(queries per micro-batch per process, micro-batches per step) of ``cfg`` on ``world_size`` processes.

    Without ``training.global_batch_size``: the config's own two numbers. With it, both are derived so that
    every step still covers exactly that many queries: the same mathematics on any world size (issue 19).
    Contrastive losses take their in-batch negatives from one micro-batch, so they never accumulate; the
    distillation loss sums over micro-batches, so a micro-batch is capped by ``per_device_batch_size``."""
    t = cfg.training
    if t.global_batch_size is None:
        return t.per_device_batch_size, t.gradient_accumulation_steps
    g = t.global_batch_size
    cap = t.per_device_batch_size if cfg.loss.name == "distillation" else g
    if (split := _split(g, world_size, cap)) is not None:
        return split
    fits = [w for w in range(1, min(g, 4096) + 1) if _split(g, w, cap) is not None]
    raise ConfigError(
        f"training.global_batch_size {g} cannot be split over {world_size} processes"
        + ("" if cap == g else f" in micro-batches of at most {cap} (training.per_device_batch_size)")
        + f"; world sizes that work: {', '.join(map(str, fits[:16]))}{' ...' if len(fits) > 16 else ''}"
    )


def job_scale(cfg: TrainConfig, world_size: int) -> Scale:
    """The :class:`Scale` of ``cfg`` run by ``world_size`` processes."""
    t = cfg.training
    gather = t.gather_across_devices if t.gather_across_devices is not None else world_size > 1
    per_device, accumulation = micro_batches(cfg, world_size)
    return Scale(
        world_size=world_size,
        per_device=per_device,
        accumulation=accumulation,
        docs_per_query=1 + (cfg.mine.negatives if cfg.mine else len(cfg.data.train.columns.negatives)),
        gather=gather,
        loss=cfg.loss.name,
    )


def _one_line(err: ValidationError, source: str) -> str:
    """Turn pydantic's report into one line naming the key and the fix."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"] if not str(p).startswith("function-after"))
    # drop the discriminator tag pydantic inserts into union paths
    for tag in ("contrastive.", "cached-contrastive.", "distillation."):
        loc = loc.replace(f"loss.{tag}", "loss.")
    kind = first["type"]
    if kind == "extra_forbidden":
        msg = f"unknown key '{loc}': remove it or check its spelling"
    elif kind == "missing":
        msg = f"missing required key '{loc}'"
    elif kind == "union_tag_invalid":
        msg = f"'{loc}': {first['msg']}"
    else:
        where = f"'{loc}': " if loc else ""
        text = first["msg"].removeprefix("Value error, ")  # pydantic's prefix for a validator's ValueError
        given = first.get("input")
        # a section's own validator names the values it refuses: echoing the whole section adds a screenful
        got = "" if isinstance(given, dict) else f" (got {_clipped(repr(given))})"
        msg = f"{where}{text}{got}"
    more = len(err.errors()) - 1
    return f"{source}: {msg}" + (f" (and {more} more)" if more else "")


def _clipped(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, bounded: no aliases (a 548-byte "billion laughs" expands past 2 GB), no
    duplicate keys, no deep nesting, no integers of thousands of digits; and YAML 1.2 floats
    (``3e-05``, which Helm's ``toYaml``/``toJson`` write, is a float, not the string YAML 1.1 makes it)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ConfigError(
                f"line {event.start_mark.line + 1}: YAML aliases (*{event.anchor}) are not allowed in a config; "
                "write the value out"
            )
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise ConfigError(f"line {mark.line + 1}: nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)) or key is None:
                raise ConfigError(f"line {key_node.start_mark.line + 1}: a key must be a plain string")
            if key in seen:
                raise ConfigError(f"line {key_node.start_mark.line + 1}: key {str(key)[:60]!r} appears twice; keep one")
            seen.add(key)
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node):
        if len(node.value.lstrip("+-").replace("_", "")) > MAX_INT_DIGITS:
            line = node.start_mark.line + 1
            raise ConfigError(f"line {line}: an integer of {len(node.value)} digits is out of range")
        return super().construct_yaml_int(node)


_ConfigLoader.add_constructor("tag:yaml.org,2002:int", _ConfigLoader.construct_yaml_int)
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"), list("-+0123456789.")
)


_SILENT_BREAKS = re.compile("[\x85\u2028\u2029]")  # YAML 1.1 line breaks: a value would change, not fail


def load_yaml(text: str, source: str = "config") -> Any:
    """Parse config YAML with :class:`_ConfigLoader`; every problem is a one-line :class:`ConfigError`."""
    if found := _SILENT_BREAKS.search(text):
        line = text.count("\n", 0, found.start()) + 1
        raise ConfigError(
            f"{source}: line {line} holds U+{ord(found.group()):04X}, a line break to YAML that would silently "
            "change the value it is in; remove it"
        )
    try:
        return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 (a SafeLoader subclass)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{source}:{where} is not valid YAML ({getattr(e, 'problem', None) or e})") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None


def read_config_text(path: str | Path) -> str:
    """The config file's text: at most 1 MiB of UTF-8, or one line saying what is wrong."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p} (pass an existing --config FILE.yaml)")
    if p.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{p}: {p.stat().st_size} bytes is too large for a config (at most {MAX_CONFIG_BYTES})")
    try:
        return p.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte {e.start}); save the file as UTF-8") from None


def parse_config(data: Any, source: str = "config") -> TrainConfig:
    """Validate an already-parsed mapping; raise :class:`ConfigError` with one line."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of keys, got {type(data).__name__}")
    _refuse_credentials(data, source)
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_one_line(e, source)) from e


def _refuse_credentials(data: Any, source: str, where: str = "") -> None:
    """No key or string of the config may hold a credential: the config becomes the job's ConfigMap."""
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        path = f"{where}.{key}" if where and isinstance(key, str) else f"{where}[{key}]" if where else str(key)
        for text in (key, value):
            if isinstance(text, str) and (kind := credential_in(text)):
                shown = f"a key under '{where or 'the top level'}' is" if text is key else f"'{path}' holds"
                raise ConfigError(
                    f"{source}: {shown} {kind} (not shown); the config is written into the job's ConfigMap in "
                    "clear: pass credentials as environment variables from a Secret (--secret-env) instead"
                )
        _refuse_credentials(value, source, path)


def load_config(path: str | Path) -> TrainConfig:
    """Read and validate a YAML config file."""
    return parse_config(load_yaml(read_config_text(path), str(path)), str(path))


def json_schema(ref_template: str = "#/$defs/{model}") -> dict[str, Any]:
    """The JSON schema of :class:`TrainConfig`, embedded in the chart's values.schema.json
    (which passes a ``ref_template`` that keeps its definitions apart from the chart's own)."""
    return TrainConfig.model_json_schema(ref_template=ref_template)
