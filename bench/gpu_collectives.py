"""The trainer's collectives on the device's own tensors: the gather (forward all-gather, backward
reduce-scatter) and DDP's bucketed all-reduce, checked against values computed by hand.

    torchrun --nproc_per_node=2 bench/gpu_collectives.py OUT.json

On one GPU both processes share it through gloo (NCCL refuses two ranks on one device); with two or
more GPUs, each rank takes its own and NCCL runs. Rank 0 writes {check: {ok, seconds, error}}.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist

from trainer import distributed as D
from trainer import grad_sync


def _check(name: str, fn, report: dict) -> None:
    start = time.perf_counter()
    try:
        fn()
        report[name] = {"ok": True, "seconds": round(time.perf_counter() - start, 4), "error": None}
    except Exception as e:  # noqa: BLE001 - the report says what failed; the run goes on
        report[name] = {"ok": False, "seconds": None, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}


def main() -> None:
    out = Path(sys.argv[1])
    gpus = torch.cuda.device_count()
    backend = "nccl" if gpus >= 2 else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", rank % max(gpus, 1)) if gpus else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    report: dict = {"backend": backend, "device": str(device), "world_size": world}

    def gather(dtype: torch.dtype) -> None:
        x = (torch.arange(6, dtype=torch.float32, device=device).view(3, 2) + 10 * rank).to(dtype)
        x.requires_grad_()
        y = D.all_gather_with_grad(x)
        weights = torch.full_like(y, rank + 1.0)
        (y * weights).sum().backward()
        expected_y = torch.cat([torch.arange(6.0).view(3, 2) + 10 * r for r in range(world)])
        assert torch.equal(y.detach().float().cpu(), expected_y), "all-gather values"
        total = sum(r + 1.0 for r in range(world))  # every rank's weight for this slice, summed
        assert torch.allclose(x.grad.float().cpu(), torch.full((3, 2), total)), "reduce-scatter gradient"

    def ddp_buckets() -> None:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)]).to(device)
        ddp = grad_sync.wrap(model, device)
        base = torch.randn(16, 256, generator=torch.Generator().manual_seed(1)).to(device)
        ddp(base * (rank + 1)).pow(2).mean().backward()
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        every = [torch.empty_like(grads) for _ in range(world)]
        dist.all_gather(every, grads)
        assert all(torch.equal(g, grads) for g in every), "ranks hold different averaged gradients"
        local = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)]).to(device)
        local.load_state_dict(model.state_dict())
        expected = []
        for r in range(world):  # each rank's own gradient, averaged by hand
            local.zero_grad()
            local(base * (r + 1)).pow(2).mean().backward()
            expected.append(torch.cat([p.grad.reshape(-1) for p in local.parameters()]))
        mean = sum(expected) / world
        assert torch.allclose(grads, mean, rtol=1e-4, atol=1e-6), "DDP average != hand average"

    _check("gather_fp32", lambda: gather(torch.float32), report)
    _check("gather_bf16", lambda: gather(torch.bfloat16), report)
    _check("ddp_bucketed_all_reduce", ddp_buckets, report)
    if rank == 0:
        out.write_text(json.dumps(report, indent=2) + "\n")
    dist.barrier()  # leave together (see trainer.distributed.process_group)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
