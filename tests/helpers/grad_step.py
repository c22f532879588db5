"""One optimizer step's gradient, computed with the trainer's own pieces; rank 0 saves it.

Run as ``python grad_step.py ...`` (one process) or under ``torchrun --nproc_per_node=2``.
"""

import os
import sys

import torch

from trainer import distributed as D
from trainer.config import CachedContrastiveLoss, ContrastiveLoss, DataSource, ModelConfig
from trainer.data import TokenizedData, load_rows
from trainer.env import resolve
from trainer.grad_sync import OverlappedReducer
from trainer.losses import build_loss
from trainer.train import build_model

model_path, data_path, loss_name, per_device, out = sys.argv[1:6]
layout = resolve(os.environ, 0)
with D.process_group(layout, 60):
    torch.manual_seed(0)
    model = build_model(ModelConfig(name_or_path=model_path, query_length=16, document_length=48), torch.device("cpu"))
    D.broadcast_parameters(model)
    rows = load_rows(DataSource(path=data_path), distillation=False)
    data = TokenizedData(rows, model, int(per_device), layout.world_size, seed=7)
    cfg = (
        ContrastiveLoss()
        if loss_name == "contrastive"
        else CachedContrastiveLoss(name="cached-contrastive", mini_batch_size=3)
    )
    loss_fn = build_loss(cfg, gather=True)
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    reducer = OverlappedReducer(params, bucket_bytes=1 << 16) if layout.distributed else None  # many buckets
    result = loss_fn(model, data.batch(0, layout.rank, torch.device("cpu")))
    if reducer is not None and result.replay is None:
        reducer.arm()  # as the training loop does for a step's last backward
    result.loss.backward()
    if result.replay is not None:
        result.replay()
    local = float(result.loss.detach())
    if reducer is not None:
        reducer.finish()
    loss = D.mean_across(local, torch.device("cpu"))
    if layout.is_main:
        flat = torch.cat([p.grad.reshape(-1) for p in params]).double()
        torch.save({"grad": flat, "loss": loss}, out)
