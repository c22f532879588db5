"""Contrastive loss with GradCache: a large global batch at the memory cost of a mini-batch.

1. Encode every mini-batch without a graph, remembering the RNG state (dropout) of each.
2. Compute the contrastive loss on those embeddings as leaves, backward to get d loss / d emb.
3. Re-encode each mini-batch with a graph under the same RNG state and backpropagate
   ``emb . grad`` into the model.

The result is the gradient of the *mean* loss (PyLate's CachedContrastive backpropagates a sum,
which is B times larger), and it equals :class:`Contrastive`'s gradient exactly.
"""

from __future__ import annotations

import contextlib

import torch

from trainer.encode import encode, group_documents
from trainer.losses.base import LossOutput
from trainer.losses.contrastive import contrastive_from_embeddings

__all__ = ["CachedContrastive"]


def _chunks(features: dict[str, torch.Tensor], size: int) -> list[dict[str, torch.Tensor]]:
    n = next(iter(features.values())).shape[0]
    return [{k: v[i : i + size] for k, v in features.items()} for i in range(0, n, size)]


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The CPU (and this CUDA device's) RNG state before a mini-batch: its dropout masks."""
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


class CachedContrastive:
    def __init__(self, temperature: float = 1.0, gather: bool = True, mini_batch_size: int = 8):
        self.temperature = temperature
        self.gather = gather
        self.mini_batch_size = mini_batch_size

    def _embed_all(self, model, features, is_query: bool, length: int):
        """Step 1: embeddings of every mini-batch without a graph, plus the RNG state before each."""
        states, embs, masks = [], [], []
        device = next(model.parameters()).device
        with torch.no_grad():
            for chunk in _chunks(features, self.mini_batch_size):
                states.append(_rng_state(device))
                enc = encode(model, chunk, is_query, length)
                embs.append(enc.embeddings)
                masks.append(enc.mask)
        return states, torch.cat(embs), torch.cat(masks)

    def _replay(self, model, features, is_query: bool, length: int, states, grad, hold, last: bool) -> None:
        """Step 3: re-encode each mini-batch with a graph under its original RNG state (in a forked RNG,
        so the stream continues as if each text had been encoded once) and push the cached gradient.

        Every backward but the step's very last runs under ``hold()`` (DDP's ``no_sync``): the
        gradients accumulate, and the last replay's backward all-reduces them once."""
        device = next(model.parameters()).device
        devices = [device] if device.type == "cuda" else []
        chunks = _chunks(features, self.mini_batch_size)
        start = 0
        for i, (chunk, (cpu_state, cuda_state)) in enumerate(zip(chunks, states)):
            final = last and i == len(chunks) - 1
            with hold() if not final else contextlib.nullcontext():
                with torch.random.fork_rng(devices=devices):
                    torch.set_rng_state(cpu_state)
                    if cuda_state is not None:
                        torch.cuda.set_rng_state(cuda_state, device)
                    enc = encode(model, chunk, is_query, length)
                n = enc.embeddings.shape[0]
                (enc.embeddings * grad[start : start + n]).sum().backward()
            start += n

    def __call__(self, model, batch) -> LossOutput:
        q_states, q_emb, _ = self._embed_all(model, batch.queries, True, batch.query_length)
        d_states, d_emb, d_mask = self._embed_all(model, batch.documents, False, batch.document_length)

        # Step 2: the loss on detached embeddings; the loop's backward fills their gradients.
        q_leaf = q_emb.detach().requires_grad_()
        d_leaf = d_emb.detach().requires_grad_()
        docs, mask = group_documents(d_leaf, d_mask, batch.docs_per_query)  # (b, n_docs, d_tokens, dim)
        loss = contrastive_from_embeddings(q_leaf, docs, mask, self.temperature, self.gather)

        def replay(hold=contextlib.nullcontext) -> None:
            self._replay(model, batch.queries, True, batch.query_length, q_states, q_leaf.grad, hold, False)
            self._replay(model, batch.documents, False, batch.document_length, d_states, d_leaf.grad, hold, True)

        return LossOutput(loss, replay)
