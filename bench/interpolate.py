"""Weight-space interpolation of a finished ``bench/nfcorpus.py`` run with its start (WiSE-FT, Wortsman et al.):
does a trained model move too far from where it started?

    python bench/interpolate.py --data ../shared/data/nfcorpus --run /tmp/nf/sparse-dev-240/recipe-pca-1 \\
        --alphas 0 0.5 0.7 0.9

The start is what the run trained from: the base encoder with the projection started from its principal
directions over the run's own mined rows (``model.projection_init: principal``, as ``trainer/train.py``
builds it); ``alpha`` 1 is the trained model. Each mix (every floating-point weight ``(1 - alpha) x start +
alpha x trained``) is saved beside the run and scored by the same exact MaxSim as the run, on the run's split;
its nDCG@10 is paired per query against the run's. Results are kept per alpha (``RUN-wiseALPHA/result.json``)
and reused. This needs the data path and a finished run; the test suite never does.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import minilm
from bench.nfcorpus import evaluate_model, paired


def start_and_trained(run: Path, document_length: int):
    """The run's start (base encoder, principal projection over its mined rows) and its trained model."""
    import torch

    from trainer.config.schema import ModelConfig
    from trainer.data import load_rows
    from trainer.mine import mined_source
    from trainer.model import build_model
    from trainer.projection import SAMPLE_DOCUMENTS, first_documents, start_projection

    cpu = torch.device("cpu")
    lengths = {"query_length": 32, "document_length": document_length}
    cfg = ModelConfig(name_or_path=minilm(), projection_init="principal", **lengths)
    start = build_model(cfg, cpu)
    mined = run / "out" / "mined" / "round-1" / "train.parquet"
    rows = load_rows(mined_source(mined, distillation=False), distillation=False, cache_dir=str(run / "cache"))
    with torch.no_grad():
        start_projection(start, cfg, first_documents(rows, SAMPLE_DOCUMENTS))
    trained = build_model(ModelConfig(name_or_path=str(run / "out" / "final-model"), **lengths), cpu)
    return start, trained


def mixes(start, trained, alphas: list[float]):
    """Load each alpha's mix into ``trained`` in turn and yield the alpha: every floating-point weight
    ``(1 - alpha) x start + alpha x trained``, the rest (position ids) as trained has them. Both ends are copied
    first: a state dict shares its tensors with the module, so loading a mix would change the next mix's end."""
    s0 = {k: v.detach().clone() for k, v in start.state_dict().items()}
    s1 = {k: v.detach().clone() for k, v in trained.state_dict().items()}
    if s0.keys() != s1.keys():
        raise SystemExit(f"the trained model's weights are not its start's ({sorted(set(s0) ^ set(s1))[:4]})")
    for alpha in alphas:
        trained.load_state_dict(
            {k: (1 - alpha) * s0[k] + alpha * s1[k] if s0[k].is_floating_point() else s1[k] for k in s0}
        )
        yield alpha


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="the BEIR NFCorpus directory the run used")
    parser.add_argument("--run", type=Path, required=True, help="a finished run's directory (ARM-SEED)")
    parser.add_argument("--split", choices=["dev", "test"], default="dev")
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.5, 0.7, 0.9])
    parser.add_argument("--document-length", type=int, default=128)
    args = parser.parse_args()
    if not (args.run / "result.json").is_file() or not (args.run / "out" / "final-model").is_dir():
        raise SystemExit(f"--run {args.run}: no result.json and out/final-model; give a finished nfcorpus.py run")
    args.threads = 1  # evaluate_model's setting
    start, trained = start_and_trained(args.run, args.document_length)
    base = {1: json.loads((args.run / "result.json").read_text())}
    print(f"{args.run.name} (alpha 1): nDCG@10 {base[1]['ndcg@10']:.4f}")
    for alpha in mixes(start, trained, args.alphas):
        out = args.run.parent / f"{args.run.name}-wise{alpha}"
        done = out / "result.json"
        if not done.is_file():
            trained.save(str(out / "model"))
            m = evaluate_model(out / "model", types.SimpleNamespace(**vars(args)))
            done.write_text(json.dumps({"ndcg@10": m["ndcg@10"], "per_query": m["per_query"]}))
        mixed = {1: json.loads(done.read_text())}
        p = paired(mixed, base)
        interval = f"[{p['low']:+.4f}, {p['high']:+.4f}]"
        print(f"alpha {alpha}: nDCG@10 {mixed[1]['ndcg@10']:.4f}, vs the run {p['gain']:+.4f} {interval}", flush=True)


if __name__ == "__main__":
    main()
