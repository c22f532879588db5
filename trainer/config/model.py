"""The ``model:`` section: which base model, its lengths, and how a new ColBERT projection starts."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from trainer.config.base import Location, Strict

__all__ = ["ModelConfig"]


class ModelConfig(Strict):
    name_or_path: Location = Field(
        "sentence-transformers/all-MiniLM-L6-v2",
        min_length=1,
        description="A local model directory, an object-store prefix (s3://bucket/model/, staged like data), "
        "or a hub name (needs network access).",
    )
    query_length: Annotated[int, Field(ge=4, le=8192)] | Literal["auto"] = Field(
        32,
        description="Query tokens, incl. [Q] marker and expansion. auto: the smallest multiple of 8, up to 32, that "
        "holds 95% of the training queries (a base model that is a ColBERT keeps its own); the job logs what it chose.",
    )
    document_length: int = Field(180, ge=8, le=8192, description="Maximum document tokens.")
    embedding_size: int | None = Field(
        None,
        ge=8,
        le=4096,
        description="Size of a new ColBERT projection (PyLate's default 128); unset keeps a model's own.",
    )
    projection_init: Literal["random", "principal"] = Field(
        "random",
        description="How a new ColBERT projection starts (a base model that is not a ColBERT): random "
        "(PyLate's), or principal: the top principal directions of the base model's own token embeddings over "
        "the first training documents, so MaxSim starts close to MaxSim over the encoder's full-width "
        "embeddings. A model with its own projection is refused with principal.",
    )
    license: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9.+-]*$",
        description="The trained model's license on its card (a Hub license id, e.g. apache-2.0 or mit). Unset: "
        "the base model's, read from its own card when that is at hand (a local directory, the Hub cache).",
    )
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = Field(
        None,
        description="transformers' attention kernel: eager, sdpa (fused, PyTorch's own), or flash_attention_2 "
        "(CUDA, needs the flash-attn package and bf16/fp16). Unset: transformers' default for the model.",
    )
