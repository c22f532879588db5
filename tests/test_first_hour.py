"""The first hour, as a newcomer meets it.

The trainer: plain (query, positive) pairs train without `mine:`, every section's missing file is found at start,
metrics.json names no absolute local path, and the card carries a license, the evaluation set's real name and a
snippet that loads the model from where it is.

The path from data to a served model: the README's section runs as written; the quickstart data ships a dev split
and keeps its test bytes; an index.embeddings added to a finished job is built alone; a local sweep keeps its best
without an export destination, and its status is found from its own directory; a cluster sweep that keeps its best
model nowhere says so; register names the side that failed and the variables a store without credentials needs;
`local`'s summary says where an emptyDir job's outputs are."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from operator_cli.cli import cli
from tests.helpers import ROOT, free_port, write_triplets
from tests.helpers.serving import SERVE_PYTHON, SKIP_REASON
from tests.helpers.tune import sweep_config


def _trainer(tmp: Path, cfg: dict) -> subprocess.CompletedProcess:
    """``colbert-train`` run from ``tmp`` (the job's volume), the config's paths relative to it."""
    (tmp / "train.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "trainer", "--config", "train.yaml"]
    return subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=300, env=env)


def _pairs(path: Path, n: int) -> None:
    rows = [json.loads(line) for line in write_triplets(path, n).read_text().splitlines()]
    path.write_text("".join(json.dumps({"query": r["query"], "positive": r["positive"]}) + "\n" for r in rows))


def _strings(value) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


@pytest.mark.slow
def test_plain_pairs_train_and_the_outputs_name_no_local_path(tmp_path, tiny_model):
    from huggingface_hub import ModelCard

    from trainer.quickstart_data import build

    _pairs(tmp_path / "pairs.jsonl", 16)
    build(tmp_path / "qs", max_test_queries=10)
    res = _trainer(
        tmp_path,
        {
            "model": {"name_or_path": str(tiny_model), "query_length": 16, "document_length": 48, "license": "mit"},
            "data": {"train": {"path": "pairs.jsonl"}, "eval_beir": "qs/beir"},
            "training": {"per_device_batch_size": 4, "max_steps": 2, "log_every": 1},
            "output_dir": "out",
        },
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "no 'negative' column: plain (query, positive) pairs, trained with in-batch negatives" in res.stderr
    assert "in-batch negatives per query 3 (this rank only" in res.stderr  # 4 queries x 1 document - 1
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["model_dir"] == "out/final-model"
    assert not [s for s in _strings(metrics) if s.startswith("/") or str(tmp_path) in s]
    done = [line for line in res.stderr.splitlines() if "done: model at out/final-model" in line]
    assert done and res.stderr.index("final model saved") < res.stderr.index(done[0])
    card = ModelCard((tmp_path / "out" / "final-model" / "README.md").read_text())
    assert card.data.license == "mit"
    assert "On `qs` (test split)" in card.text and card.data.eval_results[0].dataset_name == "qs"
    assert 'models.ColBERT(model_name_or_path="out/final-model")' in card.text


@pytest.mark.slow
def test_a_missing_eval_set_is_found_before_mining(tmp_path, tiny_model):
    """data.eval_beir was read only when the first evaluation came, after mining: now at start, in one line."""
    _pairs(tmp_path / "pairs.jsonl", 8)
    res = _trainer(
        tmp_path,
        {
            "model": {"name_or_path": str(tiny_model)},
            "data": {"train": {"path": "pairs.jsonl"}, "eval_beir": "data/nfcorpus"},
            "mine": {"retriever": "bm25", "negatives": 1, "rank_range": [1, 5]},
            "training": {"max_steps": 1},
        },
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert "data.eval_beir: data/nfcorpus/corpus.jsonl not found" in res.stderr
    assert "Traceback" not in res.stderr and "mine" not in res.stderr.lower().replace("mine:", "")


def test_the_license_is_the_configs_else_the_base_models(tmp_path):
    from trainer.config.load import parse_config
    from trainer.storage.card import license_of

    base = tmp_path / "base"
    base.mkdir()
    (base / "README.md").write_text("---\nlicense: cc-by-4.0\nlibrary_name: sentence-transformers\n---\n# base\n")
    data = {"data": {"train": {"path": "t.jsonl"}}, "training": {"max_steps": 1}}
    assert license_of(parse_config({**data, "model": {"name_or_path": str(base)}})) == "cc-by-4.0"
    assert license_of(parse_config({**data, "model": {"name_or_path": str(base), "license": "mit"}})) == "mit"
    assert license_of(parse_config({**data, "model": {"name_or_path": str(tmp_path)}})) is None  # no card
    assert license_of(parse_config(data)) == "apache-2.0"  # the quickstart's MiniLM, from its packaged card


# ---- the README's path: data -> train -> a sweep on dev -> the best model -> serve --local -> an answer -----

README_PATH = "From your pairs to a served model"
TUNE_EXAMPLE = "A sweep on this machine: the quickstart's dev split"  # docs/tune.md's: the README's sweep


def shell_block(page: Path, heading: str) -> list[str]:
    """The first shell block under ``page``'s level-2 ``heading``, as bash reads it: continued lines joined,
    comment lines dropped."""
    text = page.read_text()
    body = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M).group(1)
    block = re.search(r"^```bash\n(.*?)^```", body, re.S | re.M).group(1)
    return [line for line in block.replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")]


def _wait_until_ready(command: str, server: subprocess.Popen, cwd: Path, env: dict) -> None:
    """The README's wait, as written, while the server it waits for is alive (else the server's own words)."""
    waiting = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env)
    deadline = time.monotonic() + 900  # a hang guard: loading the tiny model takes seconds
    while waiting.poll() is None:
        if server.poll() is not None or time.monotonic() > deadline:
            waiting.kill()
            log = (cwd / "serve.log").read_text()[-3000:]
            pytest.fail(f"`serve --local` never answered (exit {server.poll()}): {log}")
        time.sleep(1)
    assert waiting.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not SERVE_PYTHON.is_file(), reason=SKIP_REASON)
def test_the_readmes_path_runs_as_written(tmp_path, tiny_model):
    """README.md's "From your pairs to a served model", each command run by bash in a scratch directory standing
    for the checkout's root, with only these changes: each command that reads examples/quickstart.yaml gets
    ``--set model.name_or_path=<the tiny model> --set training.max_steps=2`` (the model and the steps), port
    8080 becomes a free port, and ``.venv`` links to this interpreter's environment. The backgrounded ``serve``
    is started by the test, to stop it at the end."""
    venv = Path(sys.prefix)
    if not (venv / "bin" / "colbert-k8s").is_file():
        pytest.skip(f"{venv} has no colbert-k8s script (pip install -e . makes it)")
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    (tmp_path / ".venv").symlink_to(venv)
    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    said: dict[str, str] = {}
    server = None

    def run(command: str) -> str:
        command, sep, comment = command.replace("8080", port).partition(" #")
        if "--config examples/quickstart.yaml" in command:
            command += f" --set model.name_or_path={tiny_model} --set training.max_steps=2"
        res = subprocess.run(
            ["bash", "-c", command + sep + comment], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert res.returncode == 0, f"{command}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        return res.stdout

    try:
        for command in shell_block(ROOT / "README.md", README_PATH):
            if command.rstrip().endswith("&"):
                with open(tmp_path / "serve.log", "w") as log:
                    server = subprocess.Popen(
                        ["bash", "-c", command.replace("8080", port).rstrip().removesuffix("&")],
                        cwd=tmp_path,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
            elif command.startswith("until "):
                _wait_until_ready(command.replace("8080", port), server, tmp_path, env)
            else:
                said[command] = run(command)
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait()
    tune = next(out for command, out in said.items() if " tune --config " in command)
    assert "qs-t1  Running" in tune and "log: tune/qs/qs-t1/log.txt" in tune and "log: tune/qs/qs-t2/log.txt" in tune
    assert "best model: " in tune
    status = next(out for command, out in said.items() if " tune status qs" in command)
    assert status.startswith("sweep qs (local, random)") and "best so far: qs-t" in status  # from its own directory
    best = tmp_path / "tune" / "qs" / "best"
    assert json.loads((best / "metrics.json").read_text())["sweep"]["split"] == "dev"
    assert "## Sweep" in (best / "final-model" / "README.md").read_text()
    answer = json.loads(next(out for command, out in said.items() if command.startswith("curl ")))
    ids = answer["predictions"][0]["ids"]
    corpus = {json.loads(line)["_id"] for line in (tmp_path / "data/quickstart/beir/corpus.jsonl").open()}
    assert len(ids) == 3 and set(ids) <= corpus

    # docs/tune.md's example is this sweep: its trials are found finished, its status read here
    example = [c for c in shell_block(ROOT / "docs" / "tune.md", TUNE_EXAMPLE) if " serve --local " not in c]
    tune_again, status_again = (run(command) for command in example)
    assert tune_again.count("finished before; kept") == 2 and status_again == status


def test_the_quickstart_data_ships_a_dev_split_and_keeps_its_test_bytes(tmp_path):
    """qrels/dev.tsv beside test.tsv, none of its queries test's; train.jsonl, the corpus and the test qrels are
    the bytes the quickstart wrote before it had a dev split (so its published figures stay those), and
    queries.jsonl is those bytes followed by the dev queries."""
    import random

    from trainer.evaluate import load_beir
    from trainer.quickstart_data import TEST_MODULES, TRAIN_MODULES, _triplets, build, write_beir

    counts = build(tmp_path / "qs")
    rng = random.Random(0)  # the quickstart without a dev split: the same draws, in the same order
    train, held = _triplets(TRAIN_MODULES, rng), _triplets(TEST_MODULES, rng)
    asked = rng.sample(held, 300)
    before = tmp_path / "before"
    write_beir(before, [(r["id"], r["positive"]) for r in held], [(r["id"], r["query"]) for r in asked])
    rows = "".join(json.dumps({k: r[k] for k in ("query", "positive", "negative")}) + "\n" for r in train)
    beir = tmp_path / "qs" / "beir"
    assert (tmp_path / "qs" / "train.jsonl").read_text() == rows
    for name in ("corpus.jsonl", "qrels/test.tsv"):
        assert (beir / name).read_bytes() == (before / name).read_bytes(), name
    assert (beir / "queries.jsonl").read_bytes().startswith((before / "queries.jsonl").read_bytes())
    dev, test = load_beir(beir, "dev"), load_beir(beir, "test")
    assert counts["dev_queries"] == len(dev.query_ids) == len(held) - 300 > 0
    assert not set(dev.query_ids) & set(test.query_ids)
    assert all(doc in set(dev.corpus_ids) for judged in dev.qrels.values() for doc in judged)
    old = load_beir(before, "test")
    assert (test.query_ids, test.queries, test.corpus_ids) == (old.query_ids, old.queries, old.corpus_ids)
    build(tmp_path / "again")
    assert (tmp_path / "again" / "beir" / "qrels" / "dev.tsv").read_bytes() == (beir / "qrels" / "dev.tsv").read_bytes()


# ---- --exact without a retrain: an index.embeddings added to a finished job --------------------------------


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_an_index_embeddings_added_to_a_finished_job_is_built_alone(tmp_path, tiny_model, monkeypatch):
    """The job is not trained again: the index phase is redone with the stored embeddings, decided before any
    model loads, and the job is whole after it (its done.json verifies the new metrics.json)."""
    from trainer.config.load import parse_config
    from trainer.phases import redo_from
    from trainer.quickstart_data import build

    _pairs(tmp_path / "pairs.jsonl", 16)
    build(tmp_path / "qs", max_test_queries=10)
    cfg = {
        "model": {"name_or_path": str(tiny_model), "query_length": 16, "document_length": 48},
        "data": {"train": {"path": "pairs.jsonl"}, "eval_beir": "qs/beir"},
        "training": {"per_device_batch_size": 4, "max_steps": 2},
        "evaluation": {"before_training": False},
        "index": {},
        "output_dir": "out",
    }
    first = _trainer(tmp_path, cfg)
    assert first.returncode == 0, first.stderr[-3000:]
    out = tmp_path / "out"
    weights = _sha(out / "final-model" / "model.safetensors")
    assert not (out / "index" / "corpus.safetensors").exists()

    cfg["index"] = {"embeddings": True}
    again = _trainer(tmp_path, cfg)
    assert again.returncode == 0, again.stderr[-3000:]
    said = again.stderr
    assert "holds no corpus embeddings, which index.embeddings asks for: building the index again" in said, said
    assert "final model saved" not in said and "step 1/2" not in said  # not trained again
    assert said.index("building the index again") < said.index("PLAID index of")
    assert (out / "index" / "corpus.safetensors").is_file()
    assert _sha(out / "final-model" / "model.safetensors") == weights
    monkeypatch.chdir(tmp_path)
    assert redo_from(parse_config(cfg)) == (None, "")  # whole: a restart does nothing more

    third = _trainer(tmp_path, cfg)
    assert third.returncode == 0 and "done before (" in third.stderr and "PLAID index of" not in third.stderr


# ---- a local sweep: its best without an export destination, its status from its own directory --------------

FAKE_TRIAL = """
import json, sys
from pathlib import Path
from trainer.run.checkpoint import write_manifest

tdir = Path(sys.argv[1])
out = tdir / "output" / "quickstart"
(out / "final-model").mkdir(parents=True, exist_ok=True)
(out / "final-model" / "config.json").write_text("{}")
write_manifest(out / "final-model")
figure = {"qs-t1": 0.31, "qs-t2": 0.52}[tdir.name]
metrics = {"steps": 2, "model_dir": "output/quickstart/final-model", "after": {"ndcg@10": figure}}
(out / "metrics.json").write_text(json.dumps(metrics))
(out / "done.json").write_text("{}")
"""
LR = "training.learning_rate=loguniform(1e-5,2e-4)"


@pytest.fixture
def fake_trials(tmp_path, monkeypatch):
    """Each trial a process that leaves what a finished trainer leaves (a final model, metrics.json, done.json)."""
    from operator_cli.tune import local

    script = tmp_path / "fake_trial.py"
    script.write_text(FAKE_TRIAL)
    monkeypatch.setattr(local._Runner, "_command", lambda self, tdir: [sys.executable, str(script), str(tdir)])
    monkeypatch.setenv("PYTHONPATH", str(ROOT))


def test_a_local_sweep_keeps_its_best_without_an_export_and_status_finds_it_here(tmp_path, fake_trials, monkeypatch):
    (tmp_path / "train.yaml").write_text(sweep_config("{max_steps: 2}"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))  # the cluster is not where status looks
    args = ["tune", "--config", "train.yaml", "--name", "qs", "--local", "--gpus-per-node", "0", "--trials", "2"]
    res = CliRunner().invoke(cli, [*args, "--param", LR])
    assert res.exit_code == 0, res.output
    rows = [line for line in res.output.splitlines() if line.startswith("qs-t")]
    assert [row.split()[:2] for row in rows] == [
        ["qs-t1", "Running"],
        ["qs-t1", "Succeeded"],
        ["qs-t2", "Running"],
        ["qs-t2", "Succeeded"],
    ]
    assert rows[0].endswith("log: tune/qs/qs-t1/log.txt") and "0.5200" in rows[3]
    best = tmp_path / "tune" / "qs" / "best"
    assert f"best model: {best} (qs-t2's output" in res.output
    metrics = json.loads((best / "metrics.json").read_text())
    assert metrics["sweep"]["trial"] == "qs-t2" and metrics["sweep"]["value"] == 0.52
    card = (best / "final-model" / "README.md").read_text()
    assert "## Sweep" in card and "`qs-t2`" in card and 'model_name_or_path="tune/qs/best/final-model"' in card
    from trainer.run.checkpoint import verify

    assert verify(best / "final-model", required=True) is None  # what serve --local checks

    status = CliRunner().invoke(cli, ["tune", "status", "qs"])
    assert status.exit_code == 0, status.output
    assert status.output.startswith("sweep qs (local, random)") and "best so far: qs-t2 ndcg@10 0.5200" in status.output
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    away = CliRunner().invoke(cli, ["tune", "status", "qs"])
    assert away.exit_code != 0 and "kubeconfig" in away.output  # no local sweep here: the cluster's


def test_tune_help_shows_run_and_a_param_typo_gets_did_you_mean(tmp_path):
    assert re.search(r"^\s+run\s+Run a sweep", CliRunner().invoke(cli, ["tune", "--help"]).output, re.M)
    (tmp_path / "train.yaml").write_text(sweep_config("{max_steps: 2}"))
    typo = "training.learnin_rate=loguniform(1e-5,2e-4)"
    res = CliRunner().invoke(cli, ["tune", "--config", str(tmp_path / "train.yaml"), "--local", "--param", typo])
    assert res.exit_code == 2
    assert "error: --param training.learnin_rate: the config has no such key; did you mean training.learning_rate?" in (
        res.output
    )


# ---- a cluster sweep that keeps its best model nowhere says so ---------------------------------------------


@pytest.mark.parametrize(
    "engine, extra, kept",
    [
        ("katib", [], False),
        ("katib", ["--pvc", "ws"], True),
        ("katib", ["--pvc-size", "10Gi"], True),
        ("optimizationjob", [], False),
    ],
    ids=["katib-emptydir", "katib-pvc", "katib-pvc-size", "optimizationjob"],
)
def test_a_cluster_sweep_keeping_its_best_nowhere_warns_in_one_line(tmp_path, engine, extra, kept):
    (tmp_path / "train.yaml").write_text(sweep_config("{max_steps: 2}"))
    args = ["tune", "--config", str(tmp_path / "train.yaml"), "--engine", engine, "--param", LR, "--dry-run"]
    res = CliRunner().invoke(cli, [*args, *extra])
    assert res.exit_code == 0, res.output
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning: the best model is kept nowhere")]
    assert len(warnings) == (0 if kept else 1), res.stderr
    if not kept:
        assert ("--pvc CLAIM" in warnings[0]) and ("export.destination" in warnings[0]) == (engine != "katib")
    empty = "resolve(s) under /workspace, an emptyDir that starts empty" in res.stderr  # render's own warning
    assert empty == (not extra) and res.stdout.startswith("apiVersion: v1\nkind: ConfigMap")


# ---- register: the side that failed, and a store without credentials in one line --------------------------


class _Refusing(http.server.BaseHTTPRequestHandler):
    """An instance metadata endpoint off a cloud VM, as a sandbox's egress proxy answers it."""

    def _refuse(self):
        self.send_response(403)
        self.end_headers()
        self.wfile.write(b"resolve_deny: denied destination")

    do_GET = do_PUT = _refuse

    def log_message(self, *args):
        pass


def test_register_names_the_side_that_failed(tmp_path, monkeypatch):
    metadata = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=metadata.serve_forever, daemon=True).start()
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", f"http://127.0.0.1:{metadata.server_address[1]}")
    try:
        registry = ["--model", "colbert-docs", "--registry-url", f"http://127.0.0.1:{free_port()}"]
        res = CliRunner().invoke(cli, ["register", "s3://models/run-1/", *registry])
    finally:
        metadata.shutdown()
    assert res.exit_code == 2
    error, hint = res.output.strip().splitlines()
    assert error.startswith("error: reading the export: s3://models/run-1/: ")
    assert "(no S3 credentials in the environment: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in error
    assert "resolve_deny" not in res.output and "api/token" not in res.output
    assert hint.startswith("hint: the export's side, not the registry")

    export = tmp_path / "export"  # an export that reads, and a registry that does not answer
    export.mkdir()
    (export / "metrics.json").write_text(json.dumps({"after": {"ndcg@10": 0.5}}))
    manifest = {"files": {"metrics.json": {"sha256": _sha(export / "metrics.json")}}}
    (export / "colbert-k8s-export.json").write_text(json.dumps(manifest))
    res = CliRunner().invoke(cli, ["register", str(export), *registry])
    assert res.exit_code == 2
    error, hint = res.output.strip().splitlines()
    assert error.startswith("error: the model registry: GET ") and "no answer" in error
    assert "MODEL_REGISTRY_URL" in hint


# ---- local: where an emptyDir job's outputs are ------------------------------------------------------------


@pytest.mark.parametrize("pod_local", [True, False], ids=["emptydir", "pvc"])
def test_the_local_summary_says_where_the_outputs_are(tmp_path, capsys, pod_local):
    from operator_cli.local.run import _summary

    ws = tmp_path / "pods" / "job-master-0" if pod_local else tmp_path
    (ws / "output").mkdir(parents=True)
    (ws / "output" / "metrics.json").write_text(json.dumps({"steps": 2, "model_dir": "output/final-model"}))
    _summary("data: {train: {path: t.jsonl}}\noutput_dir: output\n", ws, "job", 0, 3.0, pod_local)
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"model: {ws / 'output' / 'final-model'}"
    said = f"outputs in the master pod's /workspace, an emptyDir stand-in: {ws} (emptied when this job runs again"
    assert lines[-2].startswith(said) == pod_local
