"""Early stopping (``--early-stop median``): the trainer appends its periodic evaluations to ``--metrics-file`` as
they happen; the local engine stops a trial whose latest figure is below the succeeded trials' median at the same
step; Katib's Experiment (and the chart's) carries ``earlyStopping: medianstop``; what cannot stop is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner

from operator_cli.cli import cli
from operator_cli.kube.kinds import SWEEPS
from operator_cli.spec import JobSpec
from operator_cli.tune import local
from operator_cli.tune.early_stop import EarlyStop
from operator_cli.tune.space import parse_space
from operator_cli.tune.spec import SweepSpec, without_export
from tests.helpers import ROOT, schemas
from tests.helpers.chart import CHART
from tests.helpers.tune import sweep_config
from trainer.reporting.metrics_file import read_lines

CONFIG = sweep_config("{max_steps: 5, learning_rate: 5.0e-5}", "evaluation: {every_steps: 1}")
LRS = "training.learning_rate=choice(1e-5,2e-5,3e-5,4e-5,5e-5)"


def _sweep(config: str = CONFIG, early: EarlyStop | None = None, engine_api: str = "pytorchjob") -> SweepSpec:
    job = JobSpec(name="sweep", config_text=without_export(config), api=engine_api, gpus_per_node=0)
    return SweepSpec(
        job=job, params=(parse_space(LRS),), config_text=config, algorithm="grid", early_stop=early or EarlyStop()
    )


# ---- the trainer: its periodic evaluations reach --metrics-file as they happen ----------------------------


@pytest.mark.slow
def test_the_trainer_appends_each_periodic_evaluation_then_the_final_one(tmp_path, tiny_model):
    from tests.helpers import write_triplets
    from trainer.quickstart_data import build

    build(tmp_path / "qs", max_test_queries=10)
    rows = write_triplets(tmp_path / "t.jsonl", 24)
    cfg = {
        "model": {"name_or_path": str(tiny_model), "query_length": 16, "document_length": 48},
        "data": {"train": {"path": str(rows)}, "eval_beir": str(tmp_path / "qs" / "beir")},
        "training": {"per_device_batch_size": 4, "max_steps": 5, "learning_rate": 1e-3},
        "evaluation": {"every_steps": 2},
        "checkpoint": {"every_steps": 100},
        "output_dir": str(tmp_path / "out"),
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(cfg))
    lines_file = tmp_path / "katib" / "metrics.json"
    res = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", str(tmp_path / "train.yaml"), "--metrics-file", str(lines_file)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    lines = read_lines(lines_file)
    assert [(x["step"], x["final"]) for x in lines] == [(2, False), (4, False), (5, True)]
    logged = [line for line in res.stderr.splitlines() if "INFO eval at step 2:" in line][0]
    assert f"ndcg@10={lines[0]['ndcg@10']:.4f}" in logged  # the figure the trainer logged at step 2
    after = json.loads((tmp_path / "out" / "metrics.json").read_text())["after"]
    assert lines[-1]["ndcg@10"] == after["ndcg@10"]  # the final line is metrics.json's
    raw = [json.loads(x) for x in lines_file.read_text().splitlines()]
    assert all(isinstance(x["ndcg@10"], str) for x in raw)  # Katib skips a value that is not a string
    assert [x["timestamp"] for x in raw] == sorted(x["timestamp"] for x in raw)  # Katib orders by them


# ---- the local engine -------------------------------------------------------------------------------------

# each trial's periodic ndcg@10 at steps 1-4; t4 falls below the median of t1-t3 at its second report
FIGURES = {
    "sweep-t1": [0.30] * 4,
    "sweep-t2": [0.32] * 4,
    "sweep-t3": [0.34] * 4,
    "sweep-t4": [0.31, 0.10, 0.10, 0.10],
    "sweep-t5": [0.40] * 4,
}
FAKE_TRIAL = """
import json, os, sys, time
from pathlib import Path
from trainer.reporting.metrics_file import append_line, write_metrics_line

tdir = Path(sys.argv[1])
with open(tdir / "runs.txt", "a") as f:
    f.write("run\\n")
figures = json.loads(os.environ["FIGURES"])[tdir.name]
for step, value in enumerate(figures, 1):
    append_line(tdir / "evaluations.jsonl", {"ndcg@10": value}, step)
    time.sleep(0.3)
time.sleep(2)  # the last step: the sweep has had time to judge every report
out = tdir / "output" / "quickstart"
out.mkdir(parents=True, exist_ok=True)
(out / "metrics.json").write_text(json.dumps({"steps": 5, "after": {"ndcg@10": figures[-1]}}))
(out / "done.json").write_text("{}")
write_metrics_line(out, tdir / "evaluations.jsonl")
"""


@pytest.fixture
def fake_trials(tmp_path, monkeypatch):
    """Each trial a process that reports FIGURES as a trainer with evaluation.every_steps 1 would."""
    script = tmp_path / "fake_trial.py"
    script.write_text(FAKE_TRIAL)
    monkeypatch.setenv("FIGURES", json.dumps(FIGURES))
    monkeypatch.setattr(local._Runner, "_command", lambda self, tdir: [sys.executable, str(script), str(tdir)])


@pytest.mark.slow
def test_a_local_trial_below_the_median_is_stopped_and_never_run_again(tmp_path, fake_trials):
    sweep = _sweep(early=EarlyStop(min_trials_required=3, start_step=2))
    said: list[str] = []
    assert local.run_sweep(sweep, tmp_path, said.append) == 0, said
    rows = {line.split()[0]: line for line in said if line.startswith("sweep-t")}
    assert "EarlyStopped" in rows["sweep-t4"], said
    assert "ndcg@10 0.1000 at step" in rows["sweep-t4"] and "below the median 0.3200 of 3 succeeded" in rows["sweep-t4"]
    assert all("Succeeded" in rows[t] for t in ("sweep-t1", "sweep-t2", "sweep-t3", "sweep-t5")), said
    assert any(line.startswith("best: sweep-t5 ndcg@10 0.4000") for line in said), said
    root = local.sweep_root(tmp_path, "sweep")
    assert not (root / "sweep-t4" / "output" / "quickstart" / "done.json").exists()  # stopped before its end
    status = CliRunner().invoke(cli, ["tune", "status", "sweep", "--workdir", str(tmp_path), "-o", "json"])
    record = json.loads(status.output)
    assert [t["state"] for t in record["trials"]][3] == "EarlyStopped" and record["best"]["name"] == "sweep-t5"

    again: list[str] = []
    assert local.run_sweep(sweep, tmp_path, again.append) == 0, again
    assert all((root / t / "runs.txt").read_text() == "run\n" for t in FIGURES)  # none run again
    assert "EarlyStopped" in next(line for line in again if line.startswith("sweep-t4"))


@pytest.mark.slow
def test_without_early_stop_every_trial_runs_to_its_end(tmp_path, fake_trials):
    sweep = _sweep()
    sweep = SweepSpec(job=sweep.job, params=sweep.params, config_text=CONFIG, algorithm="grid")
    said: list[str] = []
    assert local.run_sweep(sweep, tmp_path, said.append) == 0, said
    assert sum("Succeeded" in line for line in said if line.startswith("sweep-t")) == 5, said


@pytest.mark.slow
def test_too_few_succeeded_trials_stop_nothing(tmp_path, fake_trials):
    said: list[str] = []
    assert local.run_sweep(_sweep(early=EarlyStop(min_trials_required=4, start_step=2)), tmp_path, said.append) == 0
    assert not any("EarlyStopped" in line for line in said), said


# ---- Katib and the chart -----------------------------------------------------------------------------------


def test_the_experiment_stops_by_katibs_medianstop_and_scores_a_trial_by_its_last_line():
    objects = SWEEPS["katib"].render(_sweep(early=EarlyStop(min_trials_required=2, start_step=3)))
    schemas.validate_all(objects)  # kubeflow-katib-api's typed models, the webhook's rules, medianstop's settings
    spec = objects[-1]["spec"]
    assert spec["earlyStopping"] == {
        "algorithmName": "medianstop",
        "algorithmSettings": [{"name": "min_trials_required", "value": "2"}, {"name": "start_step", "value": "3"}],
    }
    strategies = spec["objective"]["metricStrategies"]
    assert {s["value"] for s in strategies} == {"latest"} and strategies[0]["name"] == "ndcg@10"
    from kubeflow_katib_api.models import V1beta1Experiment

    typed = V1beta1Experiment.from_dict(objects[-1]).spec.early_stopping
    assert typed.algorithm_name == "medianstop" and len(typed.algorithm_settings) == 2


def _helm_experiment(values: dict) -> dict:
    import helm_python

    with helm_python.Chart.load(str(CHART)) as chart:
        out = chart.render(values=values, name="sweep", namespace="default")
    docs = [d for path, text in out.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]
    return next(d for d in docs if d["kind"] == "Experiment")


def test_the_chart_renders_the_same_early_stopping():
    config = yaml.safe_load(CONFIG)
    tune = {
        "enabled": True,
        "params": [{"key": "training.learning_rate", "space": LRS.split("=", 1)[1]}],
        "algorithm": "grid",
        "trials": 5,
        "earlyStop": "median",
        "earlyStopSettings": {"min_trials_required": 2, "start_step": 3},
    }
    from_helm = _helm_experiment({"gpusPerNode": 0, "config": config, "tune": tune})
    schemas.validate_all([from_helm])
    cli_objects = SWEEPS["katib"].render(_sweep(early=EarlyStop(min_trials_required=2, start_step=3)))
    outside = lambda spec: {k: v for k, v in spec.items() if k != "trialTemplate"}  # noqa: E731 (test_tune_chart's)
    assert outside(from_helm["spec"]) == outside(cli_objects[-1]["spec"])
    no_eval = {**config, "evaluation": {}}
    with pytest.raises(Exception, match="needs intermediate values"):
        _helm_experiment({"gpusPerNode": 0, "config": no_eval, "tune": tune})


# ---- what cannot stop anything: one line, before anything starts -------------------------------------------

BAD = [
    ("no-periodic-eval", [], "evaluation: {every_steps: 1}\n", "evaluates only after training"),
    ("too-few-reports", ["--early-stop-setting", "start_step=5"], "", "fewer than start_step 5"),
    ("unknown-setting", ["--early-stop-setting", "patience=2"], "", "KEY one of min_trials_required, start_step"),
    ("zero-setting", ["--early-stop-setting", "start_step=0"], "", "at least 1"),
    ("optimizationjob", ["--engine", "optimizationjob", "--dry-run"], "", "has no early stopping"),
    ("rounds-locally", ["--local"], "mine: {retriever: bm25, negatives: 1}\n", "each of mine.rounds 2"),
]


@pytest.mark.parametrize("args,drop,message", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_an_early_stop_that_cannot_act_is_one_line(tmp_path, args, drop, message):
    text = CONFIG.replace(drop, "mine: {retriever: bm25, negatives: 1, rounds: 2}\n" if "mine" in drop else "")
    (tmp_path / "train.yaml").write_text(text)
    where = [] if "--local" in args or "--engine" in args else ["--dry-run"]
    res = CliRunner().invoke(
        cli,
        ["tune", "--config", str(tmp_path / "train.yaml"), "--param", LRS, "--early-stop", "median", *args, *where]
        + ["--gpus-per-node", "0", "--workdir", str(tmp_path / "wd")],
        catch_exceptions=False,
    )
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert res.exit_code == 2 and len(errors) == 1 and message in errors[0], res.output
    assert not (tmp_path / "wd" / "tune").exists()
