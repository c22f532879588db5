"""The chart renders the same Katib Experiment as ``colbert-k8s tune --engine katib`` (values ``tune.*``), and
refuses what the CLI refuses."""

from __future__ import annotations

import copy

import helm_python
import pytest
import yaml

from operator_cli.kube.kinds import SWEEPS
from operator_cli.kube.kinds.katib import katib_parameter
from operator_cli.spec import JobSpec
from operator_cli.tune.space import parse_space
from operator_cli.tune.spec import SweepSpec, without_export
from tests.helpers.chart import CHART
from tests.helpers.schemas import validate_all
from trainer.config.load import load_yaml
from trainer.config.overrides import parse_override

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
    ("quote", {"tune": {"enabled": True, "params": [{"key": "mine.negatives", "space": 'choice(a"b,1)'}]}}, "quote"),
]


@pytest.mark.parametrize("values,needle", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_chart_refuses_what_tune_refuses(values, needle):
    tune = {"enabled": True, "params": [{"key": "mine.negatives", "space": "choice(1,3)"}]}
    with pytest.raises(Exception, match=needle):
        _helm({"gpusPerNode": 0, "tune": tune, **values})


# Spaces whose values the chart and the CLI may spell differently (~ and null, on and true, +1 and 1); what
# counts is what a trial's --set reads from each spelling, and the parameter type Katib samples by.
SPACES = [
    "choice(1.0,2)",  # a float with nothing after the point: 1.0, never the integer 1
    "choice(1.,2.5)",
    "choice(1e5,3)",
    "choice(2.0e3,1)",
    "choice(-0.0,1)",
    "choice(1234567.0,1)",
    "choice(1e-5,3e-5)",
    "choice(1e20,1)",
    "choice(.5,1)",
    "choice(+1,2)",
    "choice(null,3)",
    "choice(~,3)",
    "choice(.inf,1)",
    "choice(.NaN,1)",
    "choice(true,false)",
    "choice(on,off)",
    "choice('3',4)",
    "choice('a b',c)",
    "choice(linear,cosine)",
    "uniform(0,1)",
    "loguniform(1,100)",
    "int(+2,8)",
]


def _read_back(parameter: dict) -> tuple[str, list[tuple[str, str]]]:
    """A Katib parameter as a trial meets it: its type, and what ``colbert-train --set`` reads from each value."""
    space = parameter["feasibleSpace"]
    texts = space["list"] if "list" in space else [space["min"], space["max"]]
    read = [parse_override(f"training.learning_rate={text}")[1] for text in texts]
    return parameter["parameterType"], [(type(v).__name__, repr(v)) for v in read]


@pytest.mark.parametrize("space", SPACES)
def test_a_trial_reads_the_same_values_from_the_chart_as_from_the_cli(space):
    """Any key's values, as the chart takes them (the CLI's render also holds each value to the key's schema)."""
    param = {"key": "training.learning_rate", "space": space}
    tune = {"enabled": True, "params": [param], "algorithm": "random", "trials": 2, "parallel": 1, "seed": 5}
    (chart,) = next(d for d in _helm({"gpusPerNode": 0, "tune": tune}) if d["kind"] == "Experiment")["spec"][
        "parameters"
    ]
    cli = katib_parameter(parse_space(f"{param['key']}={space}"))  # what the CLI's Experiment lists
    assert _read_back(chart) == _read_back(cli)


def test_a_float_beyond_range_is_refused_not_read_as_zero():
    tune = {"enabled": True, "params": [{"key": "training.learning_rate", "space": "choice(1e400,1)"}]}
    with pytest.raises(Exception, match="1e400 is beyond a 64-bit float's range"):
        _helm({"gpusPerNode": 0, "tune": tune})
