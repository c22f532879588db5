"""The sections of what a job makes after training: the PLAID index (``index:``), the corpus in a vector
database (``vectordb:``), the encoder in ONNX (``onnx:``), the export (``export:``) and its registration
(``register:``). Pydantic and the light destination registry only; :mod:`trainer.config.schema` puts them into
the whole config."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from trainer.config.base import DESTINATION_FORMS, DESTINATION_PATTERN, Strict, parse_destination
from trainer.destinations.vectors import VECTOR_FORMS, VECTOR_PATTERN, VECTOR_SECRETS, parse_vector_url

__all__ = ["MAX_INT8_LOSS", "ExportConfig", "IndexConfig", "OnnxConfig", "RegisterConfig", "VectorDbConfig"]

MAX_INT8_LOSS = 0.01
"""nDCG@10 the int8 ONNX encoder may lose against the PyTorch model on the held-out split by default. A hundredth
is about twice the seed-to-seed standard deviation of the quickstart's trained models (docs/results.md): a loss
inside it cannot be told from noise, a larger one is a change in quality a user should choose knowingly."""


class IndexConfig(Strict):
    corpus: str | None = Field(None, description="A BEIR directory to index (default data.eval_beir).")
    nbits: int = Field(4, ge=1, le=8, description="PLAID residual compression bits.")
    pool_factor: int = Field(
        1,
        ge=1,
        le=8,
        description="Token pooling (PyLate's hierarchical pooling): each document keeps about 1/pool_factor of its "
        "token vectors, in the index and in a vector database (1: none). Queries are not pooled.",
    )
    footprint: bool = Field(
        False,
        description="Also measure, on the held-out split, nDCG@10 and Recall@100 against bytes and tokens per "
        "document for pool factors 1-3 and nbits 2 and 4 (six more index builds): metrics.json, the card, "
        "final-model/footprint.png.",
    )
    embeddings: bool = Field(
        False,
        description="Also store the corpus token embeddings (float32) beside the index, for `serve --exact`: "
        "exact MaxSim as the evaluation scores it, at 4 x dim bytes a token (PLAID's 4 bits: about an eighth).",
    )


class OnnxConfig(Strict):
    """The encoder in ONNX beside the final model (``trainer/onnx_export.py``), for ``serve --onnx``."""

    max_int8_loss: float = Field(
        MAX_INT8_LOSS,
        ge=0,
        le=1,
        description="nDCG@10 on the held-out split that the int8 form may lose against the PyTorch model; more, "
        "and the card says so and `serve --onnx int8` refuses it without --allow-int8-loss.",
    )


def _destination(value: str) -> str:
    parse_destination(value)
    return value


def _vector_destination(value: str) -> str:
    parse_vector_url(value)
    return value


class VectorDbConfig(Strict):
    """The vector database the corpus goes into after training, encoded by the model (``trainer/vectordb.py``)."""

    destination: Annotated[str, AfterValidator(_vector_destination)] = Field(
        description=f"{VECTOR_FORMS}. The corpus (index.corpus, else data.eval_beir) is encoded and written "
        f"there, each document's token vectors; a key comes from the environment ({VECTOR_SECRETS}).",
        json_schema_extra={"pattern": VECTOR_PATTERN},
    )
    replace: bool = Field(
        False,
        description="A collection this export did not write (none of colbert-k8s's, or another model's, pooling "
        "or corpus) is dropped and written anew; without it, such a collection is refused.",
    )
    chunk_size: int = Field(
        512, ge=1, le=65536, description="Documents encoded and written at once: memory is bounded by a chunk."
    )


class ExportConfig(Strict):
    """Where the trained model goes when the job ends (``trainer/storage/export.py``)."""

    destination: Annotated[str, AfterValidator(_destination)] = Field(
        description=f"{DESTINATION_FORMS}. The final model (with its card), metrics.json and a manifest go there; "
        "credentials come from the environment.",
        json_schema_extra={"pattern": DESTINATION_PATTERN},
    )
    include: list[Literal["best-model", "index", "checkpoint"]] = Field(
        default_factory=list, description="Also export these: best-model, the PLAID index, the last checkpoint."
    )
    revision: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,99}$", description="hf:// only: the branch to commit to."
    )
    private: bool = Field(False, description="hf:// only: create the repository private when it does not exist.")
    replace: bool = Field(
        False,
        description="hf:// only: a repository that holds files but no colbert-k8s-export.json is replaced whole "
        "(its files removed); without it, such a repository is refused at start.",
    )
    allow_regression: bool = Field(
        False,
        description="Export (and register) a trained model that scores below the base model as it ships on the "
        "held-out split; without it such a model stays in output_dir and the job fails with both figures.",
    )


class RegisterConfig(Strict):
    """The Kubeflow Model Registry entry the export becomes (``trainer/serve/register.py``), once, after it."""

    name: str = Field(min_length=1, max_length=200, pattern=r"^[\x20-\x7E]+$", description="The registered model.")
    version: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        pattern=r"^[\x20-\x7E]+$",
        description="The version's name (default: the job's name and the first 8 hex of the export manifest's sha256).",
    )
    description: str | None = Field(None, max_length=2000, description="The version's description.")
    labels: list[str] = Field(default_factory=list, description="Labels on the version (the registry UI's labels).")
    url: str | None = Field(
        None,
        pattern=r"^https?://[^@\s]+$",
        description="The registry's REST endpoint (default: $MODEL_REGISTRY_URL); a token, if any, comes from "
        "$MODEL_REGISTRY_TOKEN (--secret-env), never from here.",
    )
    storage_key: str | None = Field(
        None,
        description="The storage Secret's name a KServe deployment fetches the export with (the artifact's "
        "storageKey).",
    )
