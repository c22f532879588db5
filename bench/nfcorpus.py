"""Mining judged on real data: NFCorpus (BEIR, medical) nDCG@10 of mining recipes at equal optimizer steps.

    python bench/nfcorpus.py --data ../shared/data/nfcorpus --split dev --seeds 1 2 3 --workdir /tmp/nf-dev
    python bench/nfcorpus.py --data ../shared/data/nfcorpus --split test --arms bm25-1 reference recipe

Settings are chosen on ``--split dev`` and reported on ``--split test``; the training pairs are always
the train qrels. Every arm trains all-MiniLM-L6-v2 as ColBERT from the same base weights, for the same
optimizer steps, batch and learning rate, and is scored by exact MaxSim over the whole corpus:

* the pairs: every train qrel as a (query, positive) row (110,575 rows, 2,590 queries); mining keeps
  ``--rows-per-query`` of each query's rows (``mine.rows_per_query``), while all of its qrels still
  count as positives, so a labelled positive never becomes a negative;
* ``bm25-1`` (the baseline): one BM25 negative per row, sampled from BM25 ranks 1-10;
* ``reference``: PyLate's example script (``bench/reference_recipe.py``) on the same kept pairs, with
  in-batch negatives only, as a user with pairs would run it (same steps, batch, lr, lengths);
* the other arms are mining settings, each a dict of ``mine:`` keys (``ARMS``); ``recipe`` is
  ``recipes/domain-adaptation-from-pairs.yaml``'s ``mine:`` section and projection rate, with the projection
  started at random and PyLate's temperature: the recipe as shipped until session 24, so named in every stored
  result. ``SHIPPED_ARM`` is the arm that is the recipe now (a test keeps every key it sets equal to the file's).

Each arm's wall time (mining and training, model loading included; evaluation excluded) is reported
beside it: the equal-compute view. The paired difference per seed (same seed, same data order) to each
of ``bm25-1``, ``reference`` and ``dense`` that ran is reported with a 95% interval over seeds x queries
(paired bootstrap over queries, seeds pooled); the results file keeps every run's per-query nDCG@10, so a
later arm pairs against it. This file needs the data path; the test suite never does.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import json
import random
import statistics
import sys
import time
from pathlib import Path

import yaml

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ENV, ROOT, git_commit, minilm, run_colbert_train, run_reference

BASELINE = "bm25-1"
# the arms every other is paired against when they ran beside it: issue 39's bar is +0.02 over the first two,
# and the base model as it ships is what training must not fall below
AGAINST = (BASELINE, "reference", "dense")
ARMS: dict[str, dict] = {
    "bm25-1": {"retriever": "bm25", "negatives": 1, "rank_range": [1, 10], "max_score_ratio": 1.0},
    "model-1": {"retriever": "model", "negatives": 1, "rank_range": [3, 30], "max_score_ratio": 0.95},
    "model-1-far": {"retriever": "model", "negatives": 1, "rank_range": [10, 50], "max_score_ratio": 0.95},
    "model-3": {"retriever": "model", "negatives": 3, "rank_range": [3, 30], "max_score_ratio": 0.95},
    # the bm25-1 run of the same seed, once trained, mines (mine.model); its training time is added to the wall
    "trained-1": {
        "retriever": "model",
        "negatives": 1,
        "rank_range": [3, 30],
        "max_score_ratio": 0.95,
        "mine_with": "bm25-1",
    },
    "trained-1-far": {
        "retriever": "model",
        "negatives": 1,
        "rank_range": [10, 50],
        "max_score_ratio": 0.95,
        "mine_with": "bm25-1",
    },
    "reference": {},  # PyLate's script: no mining
}
ARMS["bm25-3"] = {"retriever": "bm25", "negatives": 3, "rank_range": [3, 30], "max_score_ratio": 0.95}
ARMS["bm25-1-far"] = {"retriever": "bm25", "negatives": 1, "rank_range": [10, 50], "max_score_ratio": 1.0}
ARMS["model-1-top"] = {**ARMS["model-1"], "sampling": "top"}
# top_k 1000: rows whose positive the base model ranks below 100 keep their row (model-1 keeps 1,069 of 9,394)
ARMS["model-1-k1000"] = {**ARMS["model-1"], "top_k": 1000}
MASK = {"loss": {"name": "contrastive", "mask_labelled_positives": True}}  # in-batch labelled positives out
for _arm in ("bm25-1", "bm25-3", "model-1", "model-3", "trained-1"):
    ARMS[f"{_arm}-mask"] = {**ARMS[_arm], **MASK}
ARMS["trained-1-mask"]["mine_with"] = "bm25-1-mask"

# issue 39's levers: the base model as the bi-encoder it was trained to be mines (dense), or BM25 and it fused
ARMS["dense-1"] = {"retriever": "dense", "negatives": 1, "rank_range": [3, 30], "max_score_ratio": 0.95}
ARMS["dense-3"] = {**ARMS["dense-1"], "negatives": 3}
ARMS["hybrid-1"] = {**ARMS["dense-1"], "retriever": "hybrid"}
for _arm in ("model-1", "dense-1", "bm25-1"):  # 0.3's behaviour: rows with too few candidates dropped
    ARMS[f"{_arm}-drop"] = {**ARMS[_arm], "fallback": "drop"}
HEAD = {"training": {"head_learning_rate": 1e-3}}  # the new projection starts random, the encoder does not
for _arm in ("dense-1", "model-1", "bm25-1"):
    ARMS[f"{_arm}-head"] = {**ARMS[_arm], **HEAD}
ARMS["dense"] = {}  # the base model as it ships: a bi-encoder, its own pooling, no training
# colbert-train on the kept pairs with in-batch negatives only (no mining), as PyLate's script trains
ARMS["inbatch"] = {"inbatch": True}
ARMS["inbatch-head"] = {"inbatch": True, **HEAD}
# deeper ranks: with sparse labels the top ranks are often unlabelled positives (NFCorpus: ~40 per query)
ARMS["dense-1-far"] = {**ARMS["dense-1"], "rank_range": [30, 100]}
ARMS["dense-1-far-head"] = {**ARMS["dense-1-far"], **HEAD}
ARMS["bm25-1-far-head"] = {**ARMS["bm25-1-far"], **HEAD}

RECIPE = ROOT / "recipes" / "domain-adaptation-from-pairs.yaml"
_SHIPPED = yaml.safe_load(RECIPE.read_text())
# the recipe until session 24: the file's mining and new-layer rate, but not its model or loss keys (the
# projection at random, PyLate's temperature 1), as every stored result named "recipe" ran; SHIPPED_ARM is the file
ARMS["recipe"] = {k: v for k, v in _SHIPPED["mine"].items() if k not in ("corpus",)}
if "head_learning_rate" in _SHIPPED.get("training", {}):  # the recipe's own training lever travels with it
    ARMS["recipe"]["training"] = {"head_learning_rate": _SHIPPED["training"]["head_learning_rate"]}
# sentence-transformers' NO_DUPLICATES: no query or document twice in a global batch (a popular positive twice
# is an in-batch negative equal to a positive: NFCorpus sparse has 910 positives for 2,590 queries)
ARMS["recipe-nodup"] = {
    **ARMS["recipe"],
    "training": {**ARMS["recipe"].get("training", {}), "batch_sampler": "no_duplicates"},
}
# LP-FT: the first quarter of the steps train the projection alone (training.head_only_steps), then the encoder
# joins; "head_only_share" is this script's, turned into steps for --steps
ARMS["recipe-lpft"] = {**ARMS["recipe"], "training": {**ARMS["recipe"].get("training", {}), "head_only_share": 0.25}}
ARMS["recipe-drop"] = {**ARMS["recipe"], "fallback": "drop"}  # 0.3's way: rows left too few candidates go
# ANCE's refresh: the recipe's first round, then every steps/R steps the model being trained mines again and
# training goes on from it (mine.round_start: previous); the same steps in all as the other arms
for _rounds in (2, 4):
    ARMS[f"recipe-refresh{_rounds}"] = {**ARMS["recipe"], "rounds": _rounds, "round_start": "previous"}
# The encoder's own rate, higher than PyLate's script's: at 48 steps every trained arm is still climbing (the
# same arms at 240 steps score about 0.045 more), so a faster climb may be what a short budget needs
for _lr in ("1e-4", "2e-4"):
    ARMS[f"recipe-lr{_lr}"] = {
        **ARMS["recipe"],
        "training": {**ARMS["recipe"].get("training", {}), "learning_rate": float(_lr)},
    }
# The new projection started from the base model's own principal directions (model.projection_init), not at
# random: MaxSim starts close to MaxSim over the encoder's full width
ARMS["recipe-pca"] = {**ARMS["recipe"], "model": {"projection_init": "principal"}}
# the same start at the encoder's rate: a projection that starts trained may not want the random one's 1e-3
ARMS["recipe-pca-slowhead"] = {**ARMS["recipe-pca"], "training": {"head_learning_rate": None}}
# ANCE's refresh on top of it, once, half-way: at 240 steps its negatives grow easy after step 160 (session 18)
ARMS["recipe-pca-refresh2"] = {**ARMS["recipe-refresh2"], "model": {"projection_init": "principal"}}
# Keeping the negatives hard at 240 steps by other means than re-mining (re-mined from ranks 30-100 by the model
# in training they are easy for it by construction: session 21): three negatives per row, the hardest of
# three being harder than one; and the principal start with the encoder's rate raised
ARMS["recipe-pca-neg3"] = {**ARMS["recipe-pca"], "negatives": 3}
ARMS["recipe-pca-lr1e-4"] = {
    **ARMS["recipe-pca"],
    "training": {**ARMS["recipe-pca"].get("training", {}), "learning_rate": 1e-4},
}
# The same three mined negatives, one per step, the next each epoch (training.negatives_per_row): fresh negatives
# in every epoch of a 240-step run, at one negative's cost and one negative's false-negative risk per step
ARMS["recipe-pca-rotate3"] = {
    **ARMS["recipe-pca-neg3"],
    "training": {**ARMS["recipe-pca"].get("training", {}), "negatives_per_row": 1},
}
# The principal start's rows: 1,408 of 2,590 with one label per query get random negatives, the bi-encoder
# placing their positive too low for ranks 30-100 of its top 100 (under 0.95 x the positive's score). Deeper
# candidates place more of them; and deeper ranks, which won over ranks 3-30 with one label per query, again
ARMS["recipe-pca-k300"] = {**ARMS["recipe-pca"], "top_k": 300}
ARMS["recipe-pca-deep200"] = {**ARMS["recipe-pca"], "top_k": 300, "rank_range": [50, 200]}
# The softmax's temperature (loss.temperature; PyLate's default 1): softer (2) keeps a gradient on every
# in-batch document after the hardest negative has gone easy, and weighs that hardest one, with one label per
# query often an unlabelled positive, less; sharper (0.5, 0.25; 0.125 in session 25) the opposite (session 23)
for _t in ("2", "0.5", "0.25", "0.125"):
    ARMS[f"recipe-pca-t{_t}"] = {**ARMS["recipe-pca"], "loss": {"name": "contrastive", "temperature": float(_t)}}
# The arm recipes/domain-adaptation-from-pairs.yaml is, whose test figures recipes/README.md quotes (session 24)
SHIPPED_ARM = "recipe-pca-t0.25"
ARMS[f"{SHIPPED_ARM}-drop"] = {**ARMS[SHIPPED_ARM], "fallback": "drop"}  # the named option, on the shipped recipe
# The base model as a bi-encoder teacher (issue 39): on NFCorpus it is the stronger model for the first
# hundred-odd steps, and its scores grade every candidate, also the unlabelled positives sparse labels leave
KD = {"teacher": {"name_or_path": "sentence-transformers/all-MiniLM-L6-v2"}, "loss": {"name": "distillation"}}
ARMS["dense-kd3"] = {**ARMS["recipe"], **KD, "negatives": 3, "rank_range": [1, 30], "max_score_ratio": 1.0}
ARMS["dense-kd7"] = {**ARMS["dense-kd3"], "negatives": 7}
# the same teacher on the principal start at 240 steps, one label per query: its grades of every candidate keep
# unlabelled positives from being pushed down as negatives (session 22)
ARMS["recipe-pca-kd3"] = {**ARMS["dense-kd3"], "model": {"projection_init": "principal"}}
# Self-distillation: the recipe's trained model (the same seed's `recipe` run) mines by exact MaxSim and scores
# the rows; the base model trains again from them
SELF = {"retriever": "model", "mine_with": "recipe", "teach_with_miner": True}
ARMS["self-kd3"] = {**ARMS["dense-kd3"], **SELF}
# The bi-encoder teacher over deeper ranks: with all labels, ranks 1-30 are mostly labelled positives (session 15)
ARMS["dense-kd3-deep"] = {**ARMS["dense-kd3"], "rank_range": [1, 100]}


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

    >>> refreshes(ARMS["recipe-refresh4"]), refreshes(ARMS["recipe"]), refreshes(None)
    (4, 1, 1)
    """
    return mine["rounds"] if mine and mine.get("round_start") == "previous" else 1


def config(args, pairs: Path, arm: str, seed: int, kept: Path | None = None) -> dict:
    mine = {"top_k": 100, "corpus": str(args.data), "rows_per_query": args.rows_per_query, **ARMS[arm]}
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
path, data, split, length = sys.argv[1:5]
s = load_beir(data, split)
run = search(build_model(ModelConfig(name_or_path=path, query_length=32, document_length=int(length)), "cpu"), s)
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
    start = time.perf_counter()
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
        if teacher_arm := ARMS[arm].get("mine_with"):  # that run first: its model mines
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


def paired(runs: dict[int, dict], base: dict[int, dict], draws: int = 2000) -> dict:
    """Mean paired gain over seeds, the worst seed, and a 95% bootstrap interval: each draw resamples the
    queries once and takes the same ones in every seed (a hard query is hard in every seed, so seeds are not
    independent samples of queries)."""
    seeds = [s for s in runs if s in base]
    gains = [runs[s]["ndcg@10"] - base[s]["ndcg@10"] for s in seeds]
    # a result written before per-query figures were kept pairs by its mean alone
    with_queries = [s for s in seeds if runs[s].get("per_query") and base[s].get("per_query")]
    queries = sorted(base[with_queries[0]]["per_query"]) if with_queries else []
    diffs = [[runs[s]["per_query"][q] - base[s]["per_query"][q] for q in queries] for s in with_queries]
    low = high = None
    if diffs:
        rng, n = random.Random(0), len(queries)
        means = []
        for _ in range(draws // 10):
            pick = [rng.randrange(n) for _ in range(n)]
            means.append(statistics.mean(statistics.mean(d[i] for i in pick) for d in diffs))
        means.sort()
        low, high = means[int(0.025 * len(means))], means[int(0.975 * len(means)) - 1]
    return {"gain": statistics.mean(gains), "worst": min(gains), "low": low, "high": high}


def summarize(runs: dict[str, dict[int, dict]]) -> dict:
    out = {}
    for arm, by_seed in runs.items():
        values = [r["ndcg@10"] for r in by_seed.values()]
        out[arm] = {
            "seeds": len(values),
            "mean": statistics.mean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "recall@100": statistics.mean(r["recall@100"] or 0 for r in by_seed.values()),
            "wall_seconds": statistics.mean(r["wall_seconds"] for r in by_seed.values()),
            "rows": sorted({r["rows"] for r in by_seed.values()}),
            "paired": {base: paired(by_seed, runs[base]) for base in AGAINST if base in runs and base != arm},
        }
    return out


def table(result: dict) -> str:
    """One row per arm: its mean, and its paired gain over each of ``AGAINST`` that ran (worst seed, 95% interval)."""
    against = [b for b in AGAINST if b in result["summary"]]
    lines = [
        "| arm | seeds | nDCG@10 mean ± std | "
        + "".join(f"over {b} (worst seed) [95% interval] | " for b in against)
        + "Recall@100 | rows trained from | wall s (mine + train) |",
        "|---|---|---|" + "---|" * len(against) + "---|---|---|",
    ]
    for arm, s in result["summary"].items():
        gains = "".join(f"{_gain(s['paired'].get(b))} | " for b in against)
        lines.append(
            f"| {arm} | {s['seeds']} | {s['mean']:.4f} ± {s['std']:.4f} | {gains}{s['recall@100']:.3f} "
            f"| {', '.join(map(str, s['rows']))} | {s['wall_seconds']:.0f} |"
        )
    return "\n".join(lines)


def _gain(v: dict | None) -> str:
    """``+0.0116 (+0.0020) [-0.0011, +0.0248]``, or ``-`` for an arm against itself.

    >>> _gain({"gain": 0.0116, "worst": 0.002, "low": -0.0011, "high": 0.0248})
    '+0.0116 (+0.0020) [-0.0011, +0.0248]'
    """
    if v is None:
        return "-"
    interval = f" [{v['low']:+.4f}, {v['high']:+.4f}]" if v["low"] is not None else ""
    return f"{v['gain']:+.4f} ({v['worst']:+.4f}){interval}"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(result["summary"])
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.8))
    for x, arm in enumerate(arms):
        values = [r["ndcg@10"] for r in result["runs"][arm].values()]
        colour = "#bbbbbb" if arm == BASELINE else "#fdae6b" if arm == "reference" else "#3182bd"
        ax.bar(x, result["summary"][arm]["mean"], color=colour)
        ax.scatter([x] * len(values), values, color="black", zorder=3, s=12)
        bx.scatter(result["summary"][arm]["wall_seconds"], result["summary"][arm]["mean"], color=colour)
        bx.annotate(arm, (result["summary"][arm]["wall_seconds"], result["summary"][arm]["mean"]), fontsize=7)
    ax.set_xticks(range(len(arms)), arms, rotation=30, fontsize=7)
    low = min(r["ndcg@10"] for a in arms for r in result["runs"][a].values())
    ax.set_ylim(low - 0.01, None)
    ax.set_ylabel(f"NFCorpus {result['split']} nDCG@10")
    ax.set_title(f"equal steps ({result['steps']}), a dot per seed; commit {result['commit']}", fontsize=8)
    bx.set_xlabel("wall seconds (mining + training, one process)")
    bx.set_ylabel("mean nDCG@10")
    bx.set_title("equal compute: quality against time", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


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
    parser.add_argument("--arms", nargs="+", default=[BASELINE, "reference", "recipe"], choices=list(ARMS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--document-length", type=int, default=128)
    parser.add_argument("--rows-per-query", type=int, default=4)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/nfcorpus-bench"))
    parser.add_argument("--parallel", type=int, default=2, help="runs side by side (each --threads threads)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="default bench/results/nfcorpus_SPLIT.json")
    parser.add_argument("--plot", type=Path, help="default docs/nfcorpus_SPLIT.png")
    return parser


def main() -> None:
    args = arguments().parse_args()
    args.data, args.workdir = args.data.resolve(), args.workdir.resolve()  # the runs work in other directories
    if not (args.data / "qrels" / "train.tsv").is_file():
        raise SystemExit(f"--data {args.data}: no qrels/train.tsv; give the BEIR NFCorpus directory")
    pairs, kept = prepare(args.data, args.workdir / "data", args.rows_per_query, args.labels)
    jobs = [(arm, seed) for seed in args.seeds for arm in args.arms]
    runs: dict[str, dict[int, dict]] = {arm: {} for arm in args.arms}
    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        futures = {pool.submit(run_arm, args, pairs, kept, arm, seed): (arm, seed) for arm, seed in jobs}
        for f in concurrent.futures.as_completed(futures):
            arm, seed = futures[f]
            runs[arm][seed] = f.result()
    runs = {arm: dict(sorted(by_seed.items())) for arm, by_seed in runs.items()}
    result = {
        "commit": git_commit(),
        "labels": args.labels,
        "split": args.split,
        "steps": args.steps,
        "batch": args.batch,
        "lr": args.lr,
        "document_length": args.document_length,
        "rows_per_query": args.rows_per_query,
        "seeds": args.seeds,
        "arms": {a: ARMS[a] for a in args.arms},
        "runs": runs,
    }
    result["summary"] = summarize(runs)
    name = f"nfcorpus_{args.labels}_{args.split}_{args.steps}"
    out = args.out or ROOT / "bench" / "results" / f"{name}.json"
    # per query kept (4 digits): a later session pairs a new arm against these runs without re-running them
    kept_runs = {a: {s: _rounded(r) for s, r in rs.items()} for a, rs in runs.items()}
    out.write_text(json.dumps({**result, "runs": kept_runs}, indent=1) + "\n")
    print(table(result))
    plot(result, args.plot or ROOT / "docs" / f"{name}.png")


if __name__ == "__main__":
    main()
