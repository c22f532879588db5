"""``tune`` on a cluster, over real HTTP against the in-process API (kmock): submit exactly the dry run, status
from Katib's Trials (or the OptimizationJob's result), the sweep in ``list`` beside the jobs, and ``delete``
removing the sweep and what ``tune`` created for it."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from operator_cli.cli import cli
from operator_cli.constants import V2_SHIPPED_RUNTIME
from operator_cli.kube.runtime import known_runtime
from tests.helpers.kube_emulator import Emulator

CONFIG = """\
data:
  train: {path: data/train.jsonl}
  eval_beir: data/beir
  eval_split: dev
mine: {retriever: bm25, negatives: 1}
training: {max_steps: 4}
output_dir: output
"""
PARAMS = ["--param", "training.learning_rate=loguniform(1e-5,2e-4)", "--param", "mine.negatives=choice(1,3)"]


@pytest.fixture
def api(tmp_path):
    with Emulator(tmp_path, with_sweeps=True, with_v2=True, runtimes=(known_runtime(V2_SHIPPED_RUNTIME),)) as emu:
        yield emu


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text(CONFIG)
    return path


def run(api: Emulator, *args: str):
    return CliRunner().invoke(cli, [*args, "--kubeconfig", str(api.kubeconfig)], catch_exceptions=False)


def _tune(config, engine: str, *extra: str) -> list[str]:
    api = ["--api", "trainjob"] if engine == "optimizationjob" else []
    return [
        "tune",
        "--config",
        str(config),
        "--name",
        "sweep",
        *PARAMS,
        "--engine",
        engine,
        "--gpus-per-node",
        "0",
        "--trials",
        "4",
        "--parallel",
        "2",
        *api,
        *extra,
    ]


@pytest.mark.parametrize("engine,plural", [("katib", "experiments"), ("optimizationjob", "optimizationjobs")])
def test_submit_creates_the_dry_run_and_delete_removes_it(api, config, engine, plural):
    dry = CliRunner().invoke(cli, _tune(config, engine, "--dry-run=client"))
    assert dry.exit_code == 0, dry.output
    res = run(api, *_tune(config, engine))
    assert res.exit_code == 0, res.output
    assert "tune status sweep" in res.output
    (sweep,) = api.objects(plural)
    (cm,) = api.objects("configmaps")
    want = list(yaml.safe_load_all(dry.stdout))
    for got, wanted in zip((cm, sweep), want):
        assert got["spec" if "spec" in wanted else "data"] == wanted["spec" if "spec" in wanted else "data"]
    assert cm["metadata"]["ownerReferences"][0]["kind"] == sweep["kind"]  # the ConfigMap goes with the sweep
    listed = run(api, "list", "-o", "json")
    assert [(i["name"], i["kind"]) for i in yaml.safe_load(listed.stdout)["items"]] == [("sweep", sweep["kind"])]
    again = run(api, *_tune(config, engine))
    assert again.exit_code != 0 and again.output.count("error:") == 1, again.output  # 409: one line
    gone = run(api, "delete", "sweep")
    assert gone.exit_code == 0, gone.output
    assert api.objects(plural) == [] and api.objects("configmaps") == []


def _trial(name: str, lr: str, negatives: str, state: str, ndcg: str | None) -> dict:
    observation = {"metrics": [{"name": "ndcg@10", "latest": ndcg, "max": ndcg, "min": ndcg}]} if ndcg else {}
    return {
        "apiVersion": "kubeflow.org/v1beta1",
        "kind": "Trial",
        "metadata": {"name": name, "namespace": "default", "labels": {"katib.kubeflow.org/experiment": "sweep"}},
        "spec": {
            "parameterAssignments": [
                {"name": "training_learning_rate", "value": lr},
                {"name": "mine_negatives", "value": negatives},
            ]
        },
        "status": {
            "startTime": "2026-12-02T10:00:00Z",
            "completionTime": "2026-12-02T10:02:05Z",
            "conditions": [{"type": state, "status": "True", "message": f"trial {state.lower()}"}],
            "observation": observation,
        },
    }


def test_status_reads_katibs_trials_and_names_the_best(api, config):
    assert run(api, *_tune(config, "katib")).exit_code == 0
    for trial in (
        _trial("sweep-a", "1.0e-05", "1", "Succeeded", "0.41"),
        _trial("sweep-b", "0.0001", "3", "Succeeded", "0.47"),
        _trial("sweep-c", "0.0002", "3", "Failed", None),
        _trial("sweep-d", "3.0e-05", "1", "Running", None),
    ):
        api.add("kubeflow.org/v1beta1/trials", "default", trial)
    res = run(api, "tune", "status", "sweep", "-o", "json")
    assert res.exit_code == 0, res.output
    record = yaml.safe_load(res.stdout)
    assert record["best"]["name"] == "sweep-b" and record["best"]["metric"] == 0.47
    assert record["best"]["seconds"] == 125
    assert record["best"]["values"] == {"training.learning_rate": "0.0001", "mine.negatives": "3"}
    assert [t["state"] for t in record["trials"]] == ["Succeeded", "Succeeded", "Failed", "Running"]
    table = run(api, "tune", "status", "sweep")
    assert "best so far: sweep-b ndcg@10 0.4700" in table.output and "trial failed" in table.output


def test_status_of_a_missing_sweep_is_one_line(api):
    res = run(api, "tune", "status", "nope")
    assert res.exit_code == 1 and res.output.count("error:") == 1 and "no sweep default/nope" in res.output
