"""Gradient-sync guarantees, checked on 2 gloo ranks through the production code (``grad_sync.wrap``,
``step.accumulate_gradients``, ``distributed.all_gather_with_grad``); rank 0 writes a JSON report.

Run under ``torchrun --nproc_per_node=2 sync_checks.py MODEL OUT.json``.
"""

import contextlib
import json
import sys

import torch
import torch.distributed as dist

from trainer import distributed as D
from trainer import grad_sync
from trainer.config.schema import ModelConfig
from trainer.losses import LossOutput
from trainer.model import build_model
from trainer.run.state import TrainState
from trainer.step import accumulate_gradients

model_path, out = sys.argv[1:3]
dist.init_process_group("gloo")
rank = dist.get_rank()
report: dict = {}


class Partial(torch.nn.Module):
    """Rank 0 uses a and b, rank 1 uses b and c, nobody uses d: four equal-sized parameters."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d = (torch.nn.Parameter(torch.ones(1000)) for _ in range(4))

    def forward(self, r: int) -> torch.Tensor:
        used = (self.a, self.b) if r == 0 else (self.b, self.c)
        return sum((i + 1.0) * (r + 1.0) * p.sum() for i, p in enumerate(used))


def state(module, forward, loss_fn) -> TrainState:
    return TrainState(
        model=module,
        forward=forward,
        params=list(module.parameters()),
        optimizer=None,
        scheduler=None,
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        autocast=contextlib.nullcontext,
        data=None,
        loss_fn=loss_fn,
        total_steps=1,
    )


# 1. parameters used on some ranks: each summed with its own partner, whatever order hooks fire in;
# 2. a parameter no rank uses keeps grad None (AdamW then leaves it alone)
toy = Partial()
wrapped = grad_sync.wrap(toy, torch.device("cpu"), find_unused_parameters=True)
t = state(toy, wrapped, lambda fwd, r: LossOutput(fwd(r)))
accumulate_gradients(t, iter([rank]))
report["partial"] = {n: (None if p.grad is None else float(p.grad[0])) for n, p in toy.named_parameters()}

# 3. the gather's backward leaves the incoming gradient alone: whoever else holds that tensor (a
#    tensor hook here, the other input of an addition) must see this rank's gradient, not a cross-rank sum
x = torch.randn(2, 3, requires_grad=True)
weights = torch.arange(12.0).view(4, 3) + rank
seen: list[torch.Tensor] = []
gathered = D.all_gather_with_grad(x)
gathered.register_hook(lambda g: seen.append(g))
(gathered * weights).sum().backward()
report["incoming_grad_untouched"] = bool(torch.equal(seen[0], weights))
every = [torch.zeros(4, 3), torch.zeros(4, 3)]
dist.all_gather(every, weights)
report["gather_grad_is_sum"] = bool(torch.equal(x.grad, sum(every)[2 * rank : 2 * rank + 2]))

# 4. ranks whose tensors differ in shape: one line naming the ranks and shapes, on every rank
try:
    D.all_gather_with_grad(torch.zeros(rank + 1, 2))
    report["shape_error"] = None
except D.ShapeMismatch as e:
    report["shape_error"] = str(e)

# 5. overlap: on the real model's layout, the first bucket's all-reduce starts while backward still runs
model = build_model(ModelConfig(name_or_path=model_path, query_length=8, document_length=8), "cpu")
params = [p for p in model.parameters() if p.requires_grad]
fired: list[int] = []
for p in params:
    p.register_post_accumulate_grad_hook(lambda _p: fired.append(1))
ddp = grad_sync.wrap(model, torch.device("cpu"))
launches: list[int] = []


def recording_hook(_state, bucket):
    launches.append(len(fired))
    t = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0])


ddp.register_comm_hook(None, recording_hook)
features = model.tokenize(["a query about gradients", "another text"], is_query=False, pad=True)
for _ in range(2):  # the second step runs on buckets rebuilt in the order gradients became ready
    fired.clear()
    launches.clear()
    ddp(dict(features))["token_embeddings"].pow(2).sum().backward()
    model.zero_grad(set_to_none=True)
report["overlap"] = {"first_launch_after_hooks": launches[0], "hooks": len(params), "buckets": len(launches)}

if rank == 0:
    with open(out, "w") as f:
        json.dump(report, f)
dist.barrier()  # leave together: a rank tearing down while the store's host still works can abort
dist.destroy_process_group()
