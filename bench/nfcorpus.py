"""Mining judged on real data: NFCorpus (BEIR, medical) nDCG@10 of mining recipes at equal optimizer steps.

    python bench/nfcorpus.py --data PATH --labels sparse --split test --steps 48 --seeds 1 2 3
    python bench/nfcorpus.py --data PATH --split dev --arms-file lab/nfcorpus-recipe/arms.yaml --arms recipe-pca \\
        --record lab/nfcorpus-recipe/results.jsonl

``--data`` is BEIR's NFCorpus directory (``corpus.jsonl``, ``queries.jsonl``, ``qrels/{train,dev,test}.tsv``;
lab/README.md says where to get it). Settings are chosen on ``--split dev`` and reported on ``--split test``; the
training pairs are always the train qrels. Every arm trains all-MiniLM-L6-v2 as ColBERT from the same base
weights, for the same optimizer steps, batch and learning rate, and is scored by exact MaxSim over the whole
corpus:

* the pairs: every train qrel as a (query, positive) row (110,575 rows, 2,590 queries); mining keeps
  ``--rows-per-query`` of each query's rows (``mine.rows_per_query``), while all of its qrels still
  count as positives, so a labelled positive never becomes a negative; ``--labels sparse`` keeps one positive
  per query, its highest-graded qrel, as most users have;
* ``bm25-1``: one BM25 negative per row, sampled from BM25 ranks 1-10;
* ``reference``: PyLate's example script (``bench/reference_recipe.py``) on the same kept pairs, with
  in-batch negatives only, as a user with pairs would run it (same steps, batch, lr, lengths);
* ``dense``: the base model as it ships, the bi-encoder it is, not trained: what training must beat;
* ``SHIPPED_ARM``: ``recipes/domain-adaptation-from-pairs.yaml`` (a test keeps every key it sets equal);
* any other arm is a study's (``--arms-file lab/STUDY/arms.yaml``), a dict of ``mine:`` keys and the
  model, loss and training keys it changes.

Each arm's wall time (mining and training, model loading included; evaluation excluded) is reported
beside it: the equal-compute view. The paired difference per seed (same seed, same data order) to each
of ``bm25-1``, ``reference`` and ``dense`` that ran is reported with a 95% interval over seeds x queries
(paired bootstrap over queries, seeds pooled). The results file keeps every run's per-query nDCG@10, so a
later arm pairs against it; ``--record`` merges it into a study's record (``lab/``), from which
``python -m lab.results`` rebuilds docs/results.md. The test suite never needs the data.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import json
import random
import sys
import time
from pathlib import Path

import yaml

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ENV, ROOT, git_commit, minilm, run_colbert_train, run_reference
from lab.record import RecordError, put_nfcorpus, summarize, table

BASELINE = "bm25-1"
# the arms every other is paired against when they ran beside it: the bar is +0.02 over the first two, and the
# base model as it ships is what training must not fall below
AGAINST = (BASELINE, "reference", "dense")
# The arms the current study runs; every other arm is a study's, in lab/STUDY/arms.yaml (--arms-file). Each is a
# dict of mine: keys plus the model/loss/training keys it changes; lab/nfcorpus-recipe/arms.yaml says which keys
# only this runner reads.
SHIPPED_ARM = "recipe-t-auto-q-auto"  # recipes/domain-adaptation-from-pairs.yaml (a test keeps them equal)
ARMS: dict[str, dict] = {
    "bm25-1": {"retriever": "bm25", "negatives": 1, "rank_range": [1, 10], "max_score_ratio": 1.0},
    "reference": {},  # PyLate's example script: no mining
    "dense": {},  # the base model as it ships: a bi-encoder, its own pooling, no training
    SHIPPED_ARM: {
        "retriever": "dense",
        "top_k": 100,
        "rank_range": [30, 100],
        "max_score_ratio": 0.95,
        "negatives": 1,
        "fallback": "random",
        "rows_per_query": 4,
        "training": {"head_learning_rate": 0.001},
        "model": {"projection_init": "principal", "query_length": "auto"},
        "loss": {"name": "contrastive", "temperature": "auto"},
    },
}
RECIPE = ROOT / "recipes" / "domain-adaptation-from-pairs.yaml"


def load_arms(path: Path | None) -> dict[str, dict]:
    """These arms and a study's (``lab/STUDY/arms.yaml``); a study's arm of the same name must be the same."""
    if path is None:
        return dict(ARMS)
    try:
        study = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise SystemExit(f"--arms-file {path}: {e.__class__.__name__}; give a study's arms.yaml") from None
    if not isinstance(study, dict) or not all(isinstance(v, dict) for v in study.values()):
        raise SystemExit(f"--arms-file {path}: not a mapping of arm name to settings; give a study's arms.yaml")
    if clash := [a for a in study if a in ARMS and study[a] != ARMS[a]]:
        raise SystemExit(f"--arms-file {path}: {', '.join(clash)} differ from this runner's; rename them there")
    return {**ARMS, **study}


def prepare(data: Path, out: Path, rows_per_query: int, labels: str = "full", seed: int = 0) -> tuple[Path, Path]:
    """``pairs.jsonl`` (every train qrel as a row) and ``kept.jsonl`` (``rows_per_query`` of each query's,
    seeded: the reference's input), written once under ``out``. ``labels="sparse"``: one positive per query,
    its highest-graded qrel (the first in the file among equals), as most users have; both files hold those."""
    from trainer.data import document_text

    if labels == "sparse":
        pairs = kept = out / "sparse.jsonl"
    else:
        pairs, kept = out / "pairs.jsonl", out / f"kept-{rows_per_query}.jsonl"
    if pairs.is_file() and kept.is_file():
        return pairs, kept
    out.mkdir(parents=True, exist_ok=True)
    docs = {d["_id"]: document_text(d, "corpus") for d in map(json.loads, open(data / "corpus.jsonl"))}
    queries = {q["_id"]: q["text"] for q in map(json.loads, open(data / "queries.jsonl"))}
    by_query: dict[str, list[str]] = {}
    with open(data / "qrels" / "train.tsv") as f:
        graded = [r for r in csv.DictReader(f, delimiter="\t") if int(r["score"]) > 0 and r["corpus-id"] in docs]
    for row in sorted(graded, key=lambda r: -int(r["score"])):  # stable: file order among equal grades
        by_query.setdefault(row["query-id"], []).append(row["corpus-id"])
    if labels == "sparse":
        with open(pairs, "w") as p:
            for qid, ids in by_query.items():
                p.write(json.dumps({"query": queries[qid], "positive": docs[ids[0]]}) + "\n")
        return pairs, kept
    rng = random.Random(seed)
    with open(pairs, "w") as p, open(kept, "w") as k:
        for qid, ids in by_query.items():
            for d in ids:
                p.write(json.dumps({"query": queries[qid], "positive": docs[d]}) + "\n")
            for d in sorted(rng.sample(ids, min(rows_per_query, len(ids)))):
                k.write(json.dumps({"query": queries[qid], "positive": docs[d]}) + "\n")
    return pairs, kept


def refreshes(mine: dict | None) -> int:
    """How many rounds share the arm's steps: a refresh's (``round_start: previous``) train on from each other.

    >>> refreshes({"rounds": 4, "round_start": "previous"}), refreshes({"rounds": 2}), refreshes(None)
    (4, 1, 1)
    """
    return mine["rounds"] if mine and mine.get("round_start") == "previous" else 1


def arms_of(args) -> dict[str, dict]:
    """The arms this invocation knows: the runner's, and ``--arms-file``'s once ``main`` has read it."""
    return getattr(args, "arms_table", ARMS)


def config(args, pairs: Path, arm: str, seed: int, kept: Path | None = None) -> dict:
    """The trainer's config of one run: the runner's defaults (the shipped recipe's batch, rate and lengths),
    then the arm's keys."""
    mine = {"top_k": 100, "corpus": str(args.data), "rows_per_query": args.rows_per_query, **arms_of(args)[arm]}
    loss = mine.pop("loss", {"name": "contrastive"})
    model = mine.pop("model", {})
    training = dict(mine.pop("training", {}))
    head_only_share = training.pop("head_only_share", 0.0)
    train: dict = {"path": str(pairs)}
    if mine.pop("inbatch", False):  # no mining: the kept pairs, in-batch negatives only
        train, mine = {"path": str(kept), "columns": {"negatives": []}}, None
    if mine and (teacher_arm := mine.pop("mine_with", None)):
        mine["model"] = str(run_dir(args, teacher_arm, seed) / "out" / "final-model")
        if mine.pop("teach_with_miner", False):  # self-distillation: the same trained model scores the rows
            mine["teacher"] = {"name_or_path": mine["model"]}
    return {
        "model": {"name_or_path": minilm(), "query_length": 32, "document_length": args.document_length, **model},
        "data": {"train": train, "eval_beir": str(args.data), "eval_split": args.split},
        "training": {
            "per_device_batch_size": args.batch,
            "max_steps": args.steps // refreshes(mine),
            "learning_rate": args.lr,
            "warmup_ratio": 0.1,
            "seed": seed,
            "log_every": 10,
            **training,
            **({"head_only_steps": round(head_only_share * args.steps // refreshes(mine))} if head_only_share else {}),
        },
        "loss": loss,
        "checkpoint": {"every_steps": 10_000},
        "evaluation": {"after_training": False},  # evaluated by evaluate_model, per query
        **({"mine": mine} if mine else {}),
    }


_EVALUATE = """
import json, sys
from trainer.config.schema import ModelConfig
from trainer.evaluate import load_beir, retrieval_metrics, search
from trainer.model import build_model
from pathlib import Path
path, data, split, length = sys.argv[1:5]
s = load_beir(data, split)
saved = json.loads((Path(path) / "config_sentence_transformers.json").read_text())  # the length it trained with
model = build_model(ModelConfig(name_or_path=path, query_length=saved.get("query_length", 32),
                                document_length=int(length)), "cpu")
run = search(model, s)
qrels = {q: s.qrels[q] for q in s.query_ids}
out = retrieval_metrics(run, qrels)
out["per_query"] = {q: retrieval_metrics({q: run[q]}, {q: qrels[q]})["ndcg@10"] for q in qrels}
print(json.dumps(out))
"""


def evaluate_model(path: Path, args) -> dict:
    """Metrics and per-query nDCG@10 of a saved model on the split, by the trainer's own exact search."""
    import subprocess

    cmd = [sys.executable, "-c", _EVALUATE, str(path), str(args.data), args.split, str(args.document_length)]
    res = subprocess.run(cmd, env={**ENV, "OMP_NUM_THREADS": str(args.threads)}, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(res.stderr[-2000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


_DENSE = """
import json, sys
from sentence_transformers import SentenceTransformer
from trainer.evaluate import load_beir, retrieval_metrics
path, data, split = sys.argv[1:4]
s = load_beir(data, split)
model = SentenceTransformer(path, device="cpu")
d = model.encode(s.corpus, batch_size=64, convert_to_tensor=True, normalize_embeddings=True)
q = model.encode(s.queries, batch_size=64, convert_to_tensor=True, normalize_embeddings=True)
top = (q @ d.T).topk(100, dim=1)
run = {qid: {s.corpus_ids[int(i)]: float(v) for v, i in zip(vs, ix)}
       for qid, vs, ix in zip(s.query_ids, top.values, top.indices)}
qrels = {q: s.qrels[q] for q in s.query_ids}
out = retrieval_metrics(run, qrels)
out["per_query"] = {q: retrieval_metrics({q: run[q]}, {q: qrels[q]})["ndcg@10"] for q in qrels}
print(json.dumps(out))
"""


def evaluate_dense(args) -> dict:
    """The base model as it ships, as the bi-encoder it is (its own pooling, exact cosine): the figure a
    user gets without training, which training must beat."""
    import subprocess

    cmd = [sys.executable, "-c", _DENSE, minilm(), str(args.data), args.split]
    res = subprocess.run(cmd, env={**ENV, "OMP_NUM_THREADS": str(args.threads)}, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(res.stderr[-2000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_dir(args, arm: str, seed: int) -> Path:
    """One run's directory: by protocol (labels), split and budget (steps), then arm and seed."""
    return args.workdir / f"{args.labels}-{args.split}-{args.steps}" / f"{arm}-{seed}"


def run_arm(args, pairs: Path, kept: Path, arm: str, seed: int) -> dict:
    """One run (reused from --workdir when finished): nDCG@10 per query, wall seconds, rows kept."""
    from filelock import FileLock

    wd = run_dir(args, arm, seed)
    wd.mkdir(parents=True, exist_ok=True)
    with FileLock(str(wd / ".lock")):  # a trained-* arm runs its teacher arm itself, maybe beside it
        return _run_arm(args, pairs, kept, arm, seed, wd)


def _run_arm(args, pairs: Path, kept: Path, arm: str, seed: int, wd: Path) -> dict:
    done = wd / "result.json"
    if done.is_file():
        return json.loads(done.read_text())
    env = {"OMP_NUM_THREADS": str(args.threads)}
    start, commit = time.perf_counter(), git_commit()  # the code this run starts with, not the code at the end
    if arm == "dense" and (same := _dense_done(args)):  # no training: one figure per split, whatever the rest
        done.write_text(same.read_text())
        return json.loads(same.read_text())
    if arm == "dense":
        metrics, wall, rows = evaluate_dense(args), 0.0, 0
    elif arm == "reference":
        extra = ["--lr", str(args.lr), "--seed", str(seed), "--save", str(wd / "model")]
        run_reference(wd, 1, minilm(), kept, args.batch, args.steps, 32, args.document_length, extra=extra, env=env)
        wall = time.perf_counter() - start
        metrics = evaluate_model(wd / "model", args)
        rows = sum(1 for _ in open(kept))
    else:
        if teacher_arm := arms_of(args)[arm].get("mine_with"):  # that run first: its model mines
            before = run_arm(args, pairs, kept, teacher_arm, seed)["wall_seconds"]
        m = run_colbert_train(wd, 1, config(args, pairs, arm, seed, kept), env)
        wall = m["wall_seconds"] + (before if teacher_arm else 0.0)
        metrics = evaluate_model(wd / "out" / "final-model", args)
        mined = sorted((wd / "out" / "mined").glob("round-*/mining.json"))
        rows = json.loads(mined[-1].read_text())["rows"] if mined else sum(1 for _ in open(kept))
    result = {
        "ndcg@10": metrics["ndcg@10"],
        "recall@100": metrics.get("recall@100"),
        "per_query": metrics.get("per_query", {}),
        "wall_seconds": round(wall, 1),
        "rows": rows,
        "commit": commit,
    }
    done.write_text(json.dumps(result))
    where = f"{args.labels} {args.split} {args.steps} steps seed {seed}"
    print(f"{where} {arm:12s} nDCG@10 {result['ndcg@10']:.4f} ({result['wall_seconds']}s)", flush=True)
    return result


def _rounded(run: dict) -> dict:
    """A run as the results file keeps it: per-query nDCG@10 to 4 digits.

    >>> _rounded({"ndcg@10": 0.3, "per_query": {"q1": 0.123456}})
    {'ndcg@10': 0.3, 'per_query': {'q1': 0.1235}}
    """
    return {**run, "per_query": {q: round(v, 4) for q, v in run.get("per_query", {}).items()}}


def _dense_done(args) -> Path | None:
    """A finished ``dense`` run on this split under any labels, budget or seed: it trains nothing, so it is the same."""
    return next(iter(sorted(args.workdir.glob(f"*-{args.split}-*/dense-*/result.json"))), None)


def arguments() -> argparse.ArgumentParser:
    """The command line; its defaults (batch, rate, lengths) are the shipped recipe's, which a test checks."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="the BEIR NFCorpus directory (train/dev/test qrels)")
    parser.add_argument("--split", choices=["dev", "test"], default="dev", help="choose on dev, report on test")
    parser.add_argument(
        "--labels",
        choices=["full", "sparse"],
        default="full",
        help="full: every train qrel (NFCorpus as given); sparse: one positive per query",
    )
    parser.add_argument("--arms", nargs="+", default=[BASELINE, "reference", "dense", SHIPPED_ARM])
    parser.add_argument("--arms-file", type=Path, help="a study's arms (lab/STUDY/arms.yaml) beside this runner's")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--document-length", type=int, default=128)
    parser.add_argument("--rows-per-query", type=int, default=4)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/nfcorpus-bench"))
    parser.add_argument("--parallel", type=int, default=2, help="runs side by side (each --threads threads)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="the results JSON; default WORKDIR/nfcorpus_LABELS_SPLIT_STEPS.json")
    parser.add_argument("--record", type=Path, help="also merge the runs into a study's lab/STUDY/results.jsonl")
    return parser


def main() -> None:
    args = arguments().parse_args()
    args.data, args.workdir = args.data.resolve(), args.workdir.resolve()  # the runs work in other directories
    if not (args.data / "qrels" / "train.tsv").is_file():
        raise SystemExit(f"--data {args.data}: no qrels/train.tsv; give the BEIR NFCorpus directory")
    args.arms_table = load_arms(args.arms_file)
    if unknown := [a for a in args.arms if a not in args.arms_table]:
        study = "" if args.arms_file else "; a study's arm needs --arms-file lab/STUDY/arms.yaml"
        raise SystemExit(f"--arms {' '.join(unknown)}: no such arm; name one of {', '.join(args.arms_table)}{study}")
    pairs, kept = prepare(args.data, args.workdir / "data", args.rows_per_query, args.labels)
    commit = git_commit()
    jobs = [(arm, seed) for seed in args.seeds for arm in args.arms]
    runs: dict[str, dict[int, dict]] = {arm: {} for arm in args.arms}
    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        futures = {pool.submit(run_arm, args, pairs, kept, arm, seed): (arm, seed) for arm, seed in jobs}
        for f in concurrent.futures.as_completed(futures):
            arm, seed = futures[f]
            runs[arm][seed] = f.result()
    runs = {arm: dict(sorted(by_seed.items())) for arm, by_seed in runs.items()}
    result = {
        "commit": commit,
        "labels": args.labels,
        "split": args.split,
        "steps": args.steps,
        "batch": args.batch,
        "lr": args.lr,
        "document_length": args.document_length,
        "rows_per_query": args.rows_per_query,
        "seeds": args.seeds,
        "arms": {a: args.arms_table[a] for a in args.arms},
        # per query kept (4 digits): a later run pairs a new arm against these without running them again
        "runs": {a: {s: _rounded(r) for s, r in rs.items()} for a, rs in runs.items()},
    }
    out = args.out or args.workdir / f"nfcorpus_{args.labels}_{args.split}_{args.steps}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result) + "\n")
    print(table(summarize(runs, AGAINST), AGAINST))
    print(f"wrote {out}")
    if args.record:
        try:
            changed = put_nfcorpus(args.record, result)
        except RecordError as e:
            raise SystemExit(f"--record: {e}") from None
        print(f"{args.record}: {changed} runs recorded; python -m lab.results rebuilds docs/results.md")


if __name__ == "__main__":
    main()
