"""The optimizer step reads nothing back to the host between log steps (issue 33): the loss of each
micro-batch is summed on the device, in float64, to the very value the host sum of Python floats gave."""

from __future__ import annotations

import torch

from tests.helpers.states import linear_state
from trainer.losses.base import LossOutput
from trainer.step import accumulate_gradients


def test_the_loss_stays_on_the_device_across_micro_batches(monkeypatch):
    model = torch.nn.Linear(3, 1)
    seen: list[torch.Tensor] = []

    def loss_fn(forward, x):
        loss = forward(x).pow(2).mean()
        seen.append(loss.detach().clone())
        return LossOutput(loss)

    t = linear_state(model, loss_fn=loss_fn, accumulation=4)
    reads = []
    item, to_float = torch.Tensor.item, torch.Tensor.__float__
    monkeypatch.setattr(torch.Tensor, "item", lambda self: reads.append("item") or item(self))
    monkeypatch.setattr(torch.Tensor, "__float__", lambda self: reads.append("float") or to_float(self))
    local = accumulate_gradients(t, iter(torch.full((2, 3), 0.1 * (i + 1)) for i in range(4)))
    monkeypatch.undo()
    assert reads == [], "a micro-batch's loss was read back to the host (a sync per micro-batch)"
    assert isinstance(local, torch.Tensor) and local.dtype == torch.float64 and local.dim() == 0
    host = 0.0
    for loss in seen:  # what the step summed before: Python floats
        host += float(loss) / 4
    assert float(local) == host and len(seen) == 4
    assert all(p.grad is not None for p in model.parameters())
