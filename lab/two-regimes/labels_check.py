"""How complete a BEIR set's training labels look to the job itself: the training pairs as bench/nfcorpus.py writes
them, mined as the shipped recipe mines (the base model as a bi-encoder over the whole corpus), through the job's
own code (trainer/labels.py: what ``loss.temperature: auto`` reads), for each labelling protocol.

    python lab/two-regimes/labels_check.py DATA_DIR [--labels full sparse]

Prints one JSON line per protocol: the structure and the temperature the recipe trains with there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import minilm  # noqa: E402
from bench.nfcorpus import ARMS, SHIPPED_ARM, prepare  # noqa: E402
from trainer import labels  # noqa: E402
from trainer.config.load import parse_config  # noqa: E402
from trainer.mine import load_pairs  # noqa: E402
from trainer.retrieval.dense import load_bi_encoder  # noqa: E402
from trainer.retrieval.search import build_retriever  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path)
    parser.add_argument("--labels", nargs="+", default=["full", "sparse"])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/labels-check"))
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    mine = {k: v for k, v in ARMS[SHIPPED_ARM].items() if k not in ("training", "model", "loss")}
    model = load_bi_encoder(minilm(), "cpu")
    for protocol in args.labels:
        pairs_file, _ = prepare(args.data.resolve(), args.workdir / protocol, 4, protocol)
        cfg = parse_config(
            {
                "model": {"name_or_path": minilm()},
                "data": {"train": {"path": str(pairs_file)}, "cache_dir": str(args.workdir / "cache")},
                "training": {"seed": args.seed},
                "mine": {**mine, "corpus": str(args.data.resolve())},
            }
        )
        pairs = load_pairs(cfg)
        retriever = build_retriever("dense", model, pairs.corpus, cfg.mine, False, args.workdir / "plaid", lambda: None)
        structure = labels.measure(retriever, pairs, pairs.rows_by_query(), cfg.training.seed, cfg.mine.top_k)
        print(
            json.dumps(
                {
                    "data": args.data.name,
                    "labels": protocol,
                    **structure,
                    "temperature": labels.temperature_for(structure),
                }
            )
        )


if __name__ == "__main__":
    main()
