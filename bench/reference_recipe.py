"""The PyLate multi-GPU how-to, followed literally, as the baseline `colbert-train` is measured against.

    torchrun --nproc_per_node=N bench/reference_recipe.py --model DIR --data train.jsonl \
        --per-device-batch 16 --max-steps 10 --out result.json

models.ColBERT + losses.Contrastive(gather_across_devices=True) + SentenceTransformerTrainer with
utils.ColBERTCollator, as the PyLate documentation shows. Written here from those public API names.
Rank 0 writes {train_seconds, hf_samples_per_second, wall_seconds, peak_rss_mb} to --out.
``hf_samples_per_second`` is HF's own counter, kept only to show what it counts (one process's
samples); bench/speed.py computes samples/s itself from steps x global batch / train_seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

START = time.perf_counter()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--per-device-batch", type=int, default=16)
    p.add_argument("--max-steps", type=int, default=10)
    p.add_argument("--query-length", type=int, default=32)
    p.add_argument("--document-length", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-5)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--save", help="save the trained model here (to evaluate it)")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import datasets
    import torch
    from pylate import losses, models, utils
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    if "WORLD_SIZE" in os.environ and not torch.cuda.is_available():
        # The one line not in the how-to: on CPU, create the gloo group ourselves. Left to the HF
        # Trainer, the group's backend is "cpu:gloo,cuda:nccl", torch.distributed.nn's all_gather
        # backward then takes its all_to_all branch, and gloo fails with "does not support alltoall".
        import torch.distributed as dist

        dist.init_process_group("gloo")
    torch.manual_seed(args.seed)  # the new projection's weights, drawn as colbert-train of this seed draws them
    model = models.ColBERT(args.model, query_length=args.query_length, document_length=args.document_length)
    train = datasets.load_dataset("json", data_files=args.data, split="train")
    training_args = SentenceTransformerTrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(args.out)), "reference-output"),
        per_device_train_batch_size=args.per_device_batch,
        max_steps=args.max_steps,
        learning_rate=args.lr,
        warmup_ratio=0.1,
        save_strategy="no",
        logging_steps=max(1, args.max_steps // 2),
        report_to="none",
        dataloader_drop_last=True,
        bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
        seed=args.seed,
    )
    trainer = SentenceTransformerTrainer(
        model=model,
        args=training_args,
        train_dataset=train,
        loss=losses.Contrastive(model=model, gather_across_devices=True),
        data_collator=utils.ColBERTCollator(tokenize_fn=model.tokenize),
    )
    result = trainer.train()
    if args.save and int(os.environ.get("RANK", "0")) == 0:
        model.save(args.save)
    if int(os.environ.get("RANK", "0")) == 0:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "hf_samples_per_second": result.metrics["train_samples_per_second"],
                    "train_seconds": result.metrics["train_runtime"],
                    "wall_seconds": time.perf_counter() - START,
                    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                },
                f,
            )


if __name__ == "__main__":
    main()
