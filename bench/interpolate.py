"""Weight-space interpolation of a finished ``bench/nfcorpus.py`` run with its start (WiSE-FT, Wortsman et al.):
does a trained model move too far from where it started?

    python bench/interpolate.py --data PATH --run WORKDIR/sparse-dev-240/recipe-pca-1 --alphas 0 0.5 0.7 0.9

The start is what the run trained from, built by the trainer's own ``trainer.train.starting_model`` from the
run's ``train.yaml`` and mined rows, after the same seed (the principal projection over those rows, or the
seeded random one); ``alpha`` 1 is the trained model. Each mix (every floating-point weight ``(1 - alpha) x
start + alpha x trained``) is saved beside the run and scored by the same exact MaxSim as the run, on the run's
split and document length; its nDCG@10 is paired per query against the run's. Results are kept per alpha
(``RUN-wiseALPHA/result.json``) and reused. ``--data`` is the BEIR NFCorpus directory the run used (lab/README.md);
the test suite never needs it.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.nfcorpus import evaluate_model
from lab.record import paired


def start_and_trained(run: Path):
    """The run's config, its start (as ``trainer/train.py`` builds it, from the run's config and mined rows) and
    its trained model."""
    import torch

    from trainer.config.load import load_config
    from trainer.data import load_rows
    from trainer.mine import mined_source
    from trainer.model import build_model
    from trainer.train import starting_model

    cfg = load_config(run / "train.yaml")
    cpu = torch.device("cpu")
    mined = run / "out" / "mined" / "round-1" / "train.parquet"
    rows = load_rows(mined_source(mined, distillation=False), distillation=False, cache_dir=str(run / "cache"))
    torch.manual_seed(cfg.training.seed)  # as train.build seeds it: a random projection starts the same
    with torch.no_grad():
        start = starting_model(cfg, rows, cpu)
    final = {"name_or_path": str(run / "out" / "final-model"), "projection_init": "random"}  # its own projection
    return cfg, start, build_model(cfg.model.model_copy(update=final), cpu)


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
    args = parser.parse_args()
    needed = ("result.json", "train.yaml", "out/final-model", "out/mined/round-1/train.parquet")
    if missing := [n for n in needed if not (args.run / n).exists()]:
        raise SystemExit(f"--run {args.run}: no {', '.join(missing)}; give a finished nfcorpus.py run's directory")
    cfg, start, trained = start_and_trained(args.run)
    args.threads, args.document_length = 1, cfg.model.document_length  # evaluate_model's settings, the run's
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
