"""One step's gradient through the trainer's own code: ``train.build`` (model under DDP, data, loss),
``data.batches`` and ``step.accumulate_gradients``. Rank 0 saves the averaged gradient and the loss.

Run as ``python grad_step.py MODEL DATA LOSS PER_DEVICE ACCUMULATION OUT`` (one process) or under
``torchrun --nproc_per_node=2``.
"""

import os
import sys

import torch

from trainer import distributed as D
from trainer.config.schema import TrainConfig
from trainer.data.batches import batches
from trainer.env import resolve
from trainer.step import accumulate_gradients
from trainer.train import build

model_path, data_path, loss_name, per_device, accumulation, out = sys.argv[1:7]
loss = {"name": loss_name} if loss_name != "cached-contrastive" else {"name": loss_name, "mini_batch_size": 3}
cfg = TrainConfig.model_validate(
    {
        "model": {"name_or_path": model_path, "query_length": 16, "document_length": 48},
        "data": {"train": {"path": data_path}, "cache_dir": os.path.join(os.path.dirname(out), "cache")},
        "loss": loss,
        "training": {
            "per_device_batch_size": int(per_device),
            "gradient_accumulation_steps": int(accumulation),
            "max_steps": 1,
            "seed": 7,
            "gather_across_devices": True,
        },
    }
)
layout = resolve(os.environ, 0)
device = torch.device("cpu")
with D.process_group(layout, 60):
    t = build(cfg, layout, device)
    feed = batches(t.data, 0, 1, layout.rank, device, 0, layout.world_size, t.accumulation)
    local = accumulate_gradients(t, feed)
    loss_mean = float(D.mean_and_any(local, False, device)[0])
    if layout.is_main:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in t.params]
        torch.save({"grad": torch.cat([g.reshape(-1) for g in grads]).double(), "loss": loss_mean}, out)
# The answer is written and the group left. Interpreter finalization can still abort a gloo rank that
# frees a work object's tensors there ("terminate called without an active exception", exit -6; seen
# once in CI on a loaded machine, pytorch#179291): it is not what this helper measures, so skip it.
sys.stdout.flush()
os._exit(0)
