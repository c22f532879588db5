"""Gradient averaging overlapped with backward: buckets of gradients are all-reduced asynchronously as
soon as every gradient in the bucket is final, while backward goes on computing the rest.

"Final" is known only during a step's last backward pass: the loop arms the reducer for it (the last
micro-batch of a plain or distillation loss). GradCache backpropagates in several replays, so it is
not armed there, and :meth:`finish` then reduces every bucket after backward, exactly as the flat
all-reduce did. Buckets are fixed at start from the parameter order, hooks fire in autograd's order
(the same graph on every rank), and buckets no hook completed are launched in index order, so every
rank issues the same collectives in the same order. The result equals one flat all-reduce divided by
the world size (the gradient-equivalence tests run through it).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["OverlappedReducer"]

BUCKET_BYTES = 25 << 20  # DDP's default


class OverlappedReducer:
    def __init__(self, params: list[torch.nn.Parameter], bucket_bytes: int = BUCKET_BYTES):
        self.params = params
        self.buckets: list[list[torch.nn.Parameter]] = []
        current, size = [], 0
        for p in reversed(params):  # backward produces the last layers' gradients first
            current.append(p)
            size += p.numel() * p.element_size()
            if size >= bucket_bytes:
                self.buckets.append(current)
                current, size = [], 0
        if current:
            self.buckets.append(current)
        self._bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self._armed = False
        self._pending: list[int] = []
        self._works: dict[int, tuple[torch.Tensor, object]] = {}
        self._handles = [p.register_post_accumulate_grad_hook(self._ready) for p in params]

    def arm(self) -> None:
        """The next backward is the step's last: launch each bucket as soon as it is complete."""
        self._armed, self._works = True, {}
        self._pending = [len(bucket) for bucket in self.buckets]

    def _ready(self, p: torch.nn.Parameter) -> None:
        if not self._armed:
            return
        i = self._bucket_of[id(p)]
        self._pending[i] -= 1
        if self._pending[i] == 0:
            self._launch(i)

    def _launch(self, i: int) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.buckets[i]]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self._works[i] = (flat, dist.all_reduce(flat, async_op=True))

    def finish(self) -> None:
        """Reduce what is left, wait for every bucket, and write the averaged gradients back."""
        for i in range(len(self.buckets)):
            if i not in self._works:
                self._launch(i)
        world = dist.get_world_size()
        for i, (flat, work) in sorted(self._works.items()):
            work.wait()
            flat /= world
            offset = 0
            for p in self.buckets[i]:
                n = p.numel()
                p.grad = flat[offset : offset + n].view_as(p).clone()
                offset += n
        self._armed, self._works = False, {}

    def close(self) -> None:
        for h in self._handles:
            h.remove()
