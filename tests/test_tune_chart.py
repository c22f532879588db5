"""The chart renders the same Katib Experiment as ``colbert-k8s tune --engine katib`` (values ``tune.*``), and
refuses what the CLI refuses."""

from __future__ import annotations

import copy

import helm_python
import pytest
import yaml

from operator_cli.kube.kinds import SWEEPS
from operator_cli.spec import JobSpec
from operator_cli.tune.space import parse_space
from operator_cli.tune.spec import SweepSpec, without_export
from tests.helpers.chart import CHART
from tests.helpers.schemas import validate_all
from trainer.config.load import load_yaml

CONFIG = {
    "data": {"train": {"path": "data/train.jsonl"}, "eval_beir": "data/beir", "eval_split": "dev"},
    "mine": {"retriever": "bm25", "negatives": 1},
    "training": {"max_steps": 4, "learning_rate": 5e-05},
    "export": {"destination": "hf://org/best"},
    "output_dir": "output/quickstart",
}
PARAMS = {
    "training.learning_rate": "loguniform(1e-5,2e-4)",
    "mine.negatives": "choice(1,3)",
    "training.lr_scheduler": "choice(linear,cosine)",
    "training.max_steps": "int(2,8)",
}


def _helm(values: dict, name: str = "sweep") -> list[dict]:
    with helm_python.Chart.load(str(CHART)) as chart:
        out = chart.render(values={"config": CONFIG, **values}, name=name, namespace="default")
    docs = [d for path, text in sorted(out.items()) if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]
    return sorted(docs, key=lambda d: ["ConfigMap", "PersistentVolumeClaim", "Experiment"].index(d["kind"]))


def _metas(obj: dict):
    yield obj["metadata"]
    trial = obj.get("spec", {}).get("trialTemplate", {}).get("trialSpec")
    if trial:
        yield trial["metadata"]
        for replica in trial["spec"]["pytorchReplicaSpecs"].values():
            yield replica["template"]["metadata"]


def _normalised(objects: list[dict]) -> list[dict]:
    out = []
    for obj in copy.deepcopy(objects):
        for meta in _metas(obj):
            meta.get("labels", {}).pop("helm.sh/chart", None)
            meta.get("annotations", {}).pop("helm.sh/resource-policy", None)
            if meta.get("annotations") == {}:
                del meta["annotations"]
        if obj["kind"] == "ConfigMap":
            obj["data"] = {k: load_yaml(v) for k, v in obj["data"].items()}
        out.append(obj)
    return out


CASES = [
    ("one-node", dict(gpus_per_node=0), dict(gpusPerNode=0), "random", 6, 2),
    (
        "two-nodes-claim",
        dict(nodes=2, gpus_per_node=8, pvc_size="100Gi"),
        dict(nodes=2, gpusPerNode=8, persistence={"size": "100Gi"}),
        "bayesian",
        12,
        3,
    ),
]


@pytest.mark.parametrize("cli_opts,values,algorithm,trials,parallel", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_chart_experiment_equals_cli(cli_opts, values, algorithm, trials, parallel):
    text = yaml.safe_dump(CONFIG)
    job = JobSpec(name="sweep", config_text=without_export(text), **cli_opts)
    spaces = tuple(parse_space(f"{k}={v}") for k, v in PARAMS.items())
    sweep = SweepSpec(
        job=job, params=spaces, config_text=text, algorithm=algorithm, trials=trials, parallel=parallel, seed=5
    )
    tune = {
        "enabled": True,
        "params": [{"key": k, "space": v} for k, v in PARAMS.items()],
        "algorithm": algorithm,
        "trials": trials,
        "parallel": parallel,
        "seed": 5,
    }
    from_helm = _helm({**values, "tune": tune})
    validate_all(from_helm)
    assert _normalised(from_helm) == _normalised(SWEEPS["katib"].render(sweep))


REFUSED = [
    ("test-split", {"config": {**CONFIG, "data": {**CONFIG["data"], "eval_split": "test"}}}, "eval_split"),
    ("no-params", {"tune": {"enabled": True, "params": []}}, "tune.params is empty"),
    ("trainjob", {"api": "trainjob"}, "api: pytorchjob"),
]


@pytest.mark.parametrize("values,needle", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_chart_refuses_what_tune_refuses(values, needle):
    tune = {"enabled": True, "params": [{"key": "mine.negatives", "space": "choice(1,3)"}]}
    with pytest.raises(Exception, match=needle):
        _helm({"gpusPerNode": 0, "tune": tune, **values})
