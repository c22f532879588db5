"""``colbert-k8s tune``: spaces, the checks made before anything starts, the Katib Experiment and the
OptimizationJob as their APIs take them, and the trial values reaching the trainer's config."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from operator_cli.cli import cli
from operator_cli.errors import CliError
from operator_cli.kube.kinds import SWEEPS
from operator_cli.render import render
from operator_cli.spec import JobSpec
from operator_cli.tune.space import parse_space
from operator_cli.tune.spec import SweepSpec, without_export
from tests.helpers import schemas
from tests.helpers.tune import sweep_config

CONFIG = sweep_config("{max_steps: 4, learning_rate: 5.0e-5}", "export: {destination: s3://bucket/models/best/}")
PARAMS = ["--param", "training.learning_rate=loguniform(1e-5,2e-4)", "--param", "mine.negatives=choice(1,3)"]


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "train.yaml"
    path.write_text(CONFIG)
    return path


def _invoke(args: list[str]):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def _sweep(algorithm: str = "random", api: str = "pytorchjob", **job) -> SweepSpec:
    spaces = (parse_space("training.learning_rate=loguniform(1e-5,2e-4)"), parse_space("mine.negatives=choice(1,3)"))
    if algorithm == "grid":
        spaces = (parse_space("training.learning_rate=choice(1e-5,2e-4)"), parse_space("training.max_steps=int(2,3)"))
    job = JobSpec(name="sweep", config_text=without_export(CONFIG), api=api, gpus_per_node=0, **job)
    return SweepSpec(
        job=job,
        params=spaces,
        config_text=CONFIG,
        algorithm=algorithm,
        trials=None if algorithm == "grid" else 6,
        parallel=2,
        seed=7,
    )


# ---- spaces ------------------------------------------------------------------------------------------------

SPACES = [
    ("loguniform", "training.learning_rate=loguniform(1e-5, 2e-4)", ("loguniform", 1e-5, 2e-4, ())),
    ("uniform", "training.warmup_ratio=uniform(0,0.2)", ("uniform", 0.0, 0.2, ())),
    ("int", "training.max_steps=int(48,480)", ("int", 48, 480, ())),
    ("choice-numbers", "mine.negatives=choice(1,3)", ("choice", None, None, (1, 3))),
    ("choice-words", "training.lr_scheduler=choice(linear,cosine)", ("choice", None, None, ("linear", "cosine"))),
]


@pytest.mark.parametrize("text,want", [c[1:] for c in SPACES], ids=[c[0] for c in SPACES])
def test_a_space_is_read_as_written(text, want):
    s = parse_space(text)
    assert (s.kind, s.low, s.high, s.choices) == want


BAD_SPACES = [
    ("no-space", "training.learning_rate", "KEY=SPACE"),
    ("unknown-kind", "training.learning_rate=normal(0,1)", "must be one of"),
    ("empty-choice", "mine.negatives=choice()", "is empty"),
    ("empty-range", "training.learning_rate=uniform(2e-4,1e-5)", "is empty"),
    ("log-of-zero", "training.learning_rate=loguniform(0,1e-4)", "LOW > 0"),
    ("int-of-floats", "training.max_steps=int(1.5,4)", "two integers"),
    ("one-bound", "training.learning_rate=uniform(1e-5)", "two numbers"),
    ("twice", "mine.negatives=choice(1,1)", "twice"),
]


@pytest.mark.parametrize("text,message", [c[1:] for c in BAD_SPACES], ids=[c[0] for c in BAD_SPACES])
def test_a_bad_space_is_one_line(text, message):
    with pytest.raises(CliError, match=re.escape(message)):
        parse_space(text)


def test_random_draws_depend_on_the_seed_and_the_index_alone():
    a, b = _sweep().plan(), _sweep().plan()
    assert [t.values for t in a] == [t.values for t in b]
    assert len({t.values["training.learning_rate"] for t in a}) > 1
    for t in a:
        assert 1e-5 <= t.values["training.learning_rate"] <= 2e-4 and t.values["mine.negatives"] in (1, 3)


def test_a_grid_is_every_point_once():
    plan = _sweep("grid").plan()
    assert [t.name for t in plan] == ["sweep-t1", "sweep-t2", "sweep-t3", "sweep-t4"]
    points = {(t.values["training.learning_rate"], t.values["training.max_steps"]) for t in plan}
    assert points == {(1e-5, 2), (1e-5, 3), (2e-4, 2), (2e-4, 3)}


class _Counted(Sequence):
    """A grid that records which of its values are read, and fails once many are: a grid copied whole."""

    def __init__(self, values: Sequence):
        self.values, self.read = values, set()

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, i):
        self.read.add(i)
        if len(self.read) > 50:
            raise AssertionError(f"{len(self.read)} values of a {len(self.values)}-value grid were read")
        return self.values[i]


def test_a_grid_makes_only_the_points_it_runs(config, monkeypatch):
    """10^9 points, --trials 2: two points are made, each from one value of each space (no grid is copied)."""
    from operator_cli.tune.space import Space

    grids: dict[str, _Counted] = {}
    grid = Space.grid
    monkeypatch.setattr(Space, "grid", lambda self: grids.setdefault(self.key, _Counted(grid(self))))
    params = ["--param", "training.max_steps=int(1,1000000)", "--param", "training.seed=int(1,1000)"]
    args = ["tune", "--config", str(config), *params, "--algorithm", "grid", "--trials", "2", "--local"]
    res = _invoke([*args, "--dry-run", "-o", "json"])
    assert res.exit_code == 0, res.output
    values = [t["values"] for t in json.loads(res.output)["trials"]]
    assert values == [{"training.max_steps": 1, "training.seed": 1}, {"training.max_steps": 1, "training.seed": 2}]
    assert len(grids["training.max_steps"]) * len(grids["training.seed"]) == 10**9
    assert grids["training.max_steps"].read == {0} and grids["training.seed"].read == {0, 1}


# ---- refused before anything starts ----------------------------------------------------------------------

BAD_INPUT = [
    ("unknown-key", ["--param", "training.learnin_rate=uniform(1e-5,1e-4)"], "", "--param training.learnin_rate"),
    ("unknown-section-key", ["--param", "mine.negativess=choice(1,2)"], "", "no such key"),
    ("empty-space", ["--param", "mine.negatives=choice()"], "", "is empty"),
    ("refused-edge", ["--param", "training.learning_rate=uniform(0,1e-4)"], "", "greater than 0"),
    ("refused-choice", ["--param", "mine.negatives=choice(1,0)"], "", "mine.negatives=0"),
    ("fixed-key", ["--param", "data.eval_split=choice(dev,test)"], "", "cannot be searched"),
    ("unknown-metric", [*PARAMS, "--metric", "ndcg@20"], "", "--metric 'ndcg@20'"),
    ("test-split", PARAMS, "  eval_split: dev\n", "data.eval_split, which is 'test'"),
    ("no-evaluation", PARAMS, "  eval_beir: data/beir\n  eval_split: dev\n", "no trial would report ndcg@10"),
    ("grid-of-floats", [*PARAMS, "--algorithm", "grid"], "", "--algorithm grid"),
    ("bayesian-here", [*PARAMS, "--algorithm", "bayesian"], "", "--algorithm bayesian"),
    ("parallel", [*PARAMS, "--trials", "2", "--parallel", "3"], "", "--parallel 3"),
    ("no-param", [], "", "at least one --param"),
]


@pytest.mark.parametrize("args,drop,message", [c[1:] for c in BAD_INPUT], ids=[c[0] for c in BAD_INPUT])
def test_bad_input_is_one_line_before_anything_starts(tmp_path, args, drop, message):
    path = tmp_path / "train.yaml"
    path.write_text(CONFIG.replace(drop, "") if drop else CONFIG)
    res = _invoke(["tune", "--config", str(path), *args, "--local", "--workdir", str(tmp_path / "wd")])
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert res.exit_code == 2 and len(errors) == 1 and message in errors[0], res.output
    assert "Traceback" not in res.output
    assert not (tmp_path / "wd" / "tune").exists()  # nothing written, no trial started


@pytest.mark.parametrize("output_dir", ["/tmp/sweep-out", "../out", "output/../../out"], ids=repr)
@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]], ids=["run", "dry-run"])
def test_an_output_dir_every_trial_would_share_is_refused(tmp_path, output_dir, dry_run):
    """``output_dir`` is placed under each trial's workspace: an absolute one or one that leaves it would be
    one folder for all, and trial 2 would find trial 1's results as its own."""
    path = tmp_path / "train.yaml"
    path.write_text(CONFIG.replace("output_dir: output/quickstart", f"output_dir: {output_dir}"))
    args = ["tune", "--config", str(path), *PARAMS, "--trials", "2", "--local", "--workdir", str(tmp_path / "wd")]
    res = _invoke([*args, *dry_run])
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert res.exit_code == 2 and len(errors) == 1, res.output
    assert f"output_dir {output_dir} " in errors[0] and "every trial of the sweep would write one folder" in errors[0]
    assert not (tmp_path / "wd" / "tune").exists()


def test_the_local_engine_refuses_a_shared_output_dir_itself(tmp_path):
    from operator_cli.tune.local import run_sweep

    sweep = _sweep()
    job = sweep.job
    cfg = job.config_text.replace("output_dir: output/quickstart", "output_dir: /tmp/sweep-out")
    sweep = SweepSpec(job=JobSpec(name="sweep", config_text=cfg, gpus_per_node=0), params=sweep.params, trials=2)
    with pytest.raises(CliError, match="output_dir /tmp/sweep-out is absolute"):
        run_sweep(sweep, tmp_path, print)
    assert not (tmp_path / "tune").exists()


# ---- Katib and the OptimizationJob ------------------------------------------------------------------------


def test_the_experiment_is_valid_and_its_trial_template_is_the_rendered_job():
    sweep = _sweep(pvc="shared")
    objects = SWEEPS["katib"].render(sweep)
    assert [o["kind"] for o in objects] == ["ConfigMap", "Experiment"]
    schemas.validate_all(objects)
    experiment = objects[-1]
    spec = experiment["spec"]
    assert (spec["maxTrialCount"], spec["parallelTrialCount"], spec["maxFailedTrialCount"]) == (6, 2, 3)
    assert spec["objective"] == {
        "type": "maximize",
        "objectiveMetricName": "ndcg@10",
        "additionalMetricNames": ["mrr@10", "recall@100", "map@100"],
        # a trial's figure is its last line, the final evaluation, not the best of its intermediate ones
        "metricStrategies": [{"name": m, "value": "latest"} for m in ("ndcg@10", "mrr@10", "recall@100", "map@100")],
    }
    assert "earlyStopping" not in spec  # only with --early-stop
    assert spec["algorithm"]["algorithmSettings"] == [{"name": "random_state", "value": "7"}]
    job = render(sweep.job)[-1]
    trial = spec["trialTemplate"]["trialSpec"]
    want = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]
    got = trial["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]
    assert got[: len(want)] == want and "--metrics-file" in got
    trial["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"] = want
    assert trial["spec"] == job["spec"]  # nothing else differs from `render`'s job
    assert "export" not in yaml.safe_load(objects[0]["data"]["train.yaml"])  # trials export nothing


def _as_katib_would(experiment: dict, values: dict[str, str], trial: str) -> list[str]:
    """The trainer's arguments of one trial, substituted as Katib substitutes ${trialParameters.NAME}."""
    template = experiment["spec"]["trialTemplate"]
    refs = {p["name"]: values.get(p["reference"], trial) for p in template["trialParameters"]}
    text = json.dumps(template["trialSpec"])
    text = re.sub(r"\$\{trialParameters\.([^}]+)\}", lambda m: refs[m.group(1)], text)
    return json.loads(text)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]


def test_a_katib_trials_values_reach_the_trainers_config(tmp_path):
    from trainer.cli import _load

    experiment = SWEEPS["katib"].render(_sweep())[-1]
    args = _as_katib_would(experiment, {"training_learning_rate": "3.5e-05", "mine_negatives": "3"}, "sweep-x7")
    (tmp_path / "train.yaml").write_text(SWEEPS["katib"].render(_sweep())[0]["data"]["train.yaml"])
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    cfg = _load(str(tmp_path / "train.yaml"), sets)
    assert cfg.training.learning_rate == 3.5e-5 and cfg.mine.negatives == 3
    assert cfg.output_dir == "output/quickstart/sweep-x7"  # trials on one claim write apart
    assert args[args.index("--metrics-file") + 1] == "/var/log/katib/metrics.json"


ROUND_TRIP = [  # every kind of value a space may list, on keys whose schema takes it
    "training.max_steps=choice(null, 100)",
    "training.gather_across_devices=choice(null, true, false)",
    "training.max_grad_norm=choice(null, 0.5, 1e-3, 3.0, 2e-05)",
    "data.train.columns.query=choice('a b', 'true', 'null', None, '1e5', '007', ' lead', 'x: y', '#c', ' it''s')",
]


def _listed(engine: str, sweep_object: dict) -> dict[str, list[str]]:
    """Each parameter's values as the sweep object lists them for its controller."""
    if engine == "katib":
        return {p["name"]: p["feasibleSpace"]["list"] for p in sweep_object["spec"]["parameters"]}
    return {p["name"]: p["searchSpace"]["categorical"]["choices"] for p in sweep_object["spec"]["parameters"]}


def _trial_args(engine: str, sweep_object: dict, texts: dict[str, str]) -> list[str]:
    """The trainer's arguments of a trial given ``texts``, substituted as the controller substitutes them."""
    if engine == "katib":
        return _as_katib_would(sweep_object, texts, "sweep-x1")
    text = json.dumps(sweep_object["spec"]["trainJobTemplate"])  # pasted into the template's text, as Katib does
    text = re.sub(r"\{\{\.([a-z_]+)\}\}", lambda m: texts[m.group(1)], text)
    return json.loads(text)["spec"]["trainer"]["args"]


@pytest.mark.parametrize("engine", ["katib", "optimizationjob"])
def test_every_value_a_cluster_sweep_lists_reaches_the_trainer_exactly(tmp_path, engine):
    """null, booleans, numbers and strings YAML would read as something else: each value listed in the
    Experiment or OptimizationJob, substituted into a trial's ``--set``, is the space's value in the trainer's
    config, of the same type (``str(None)`` would be the string "None", which max_steps refuses)."""
    from functools import reduce

    from trainer.cli import _load

    spaces = tuple(parse_space(text) for text in ROUND_TRIP)
    job = JobSpec(name="sweep", config_text=without_export(CONFIG), api=SWEEPS[engine].trial_api, gpus_per_node=0)
    objects = SWEEPS[engine].render(SweepSpec(job=job, params=spaces, config_text=CONFIG, trials=4))
    (tmp_path / "train.yaml").write_text(objects[0]["data"]["train.yaml"])
    listed = _listed(engine, objects[-1])
    for row in range(max(len(s.choices) for s in spaces)):
        pick = {s.name: min(row, len(s.choices) - 1) for s in spaces}
        args = _trial_args(engine, objects[-1], {s.name: listed[s.name][pick[s.name]] for s in spaces})
        cfg = _load(str(tmp_path / "train.yaml"), [args[i + 1] for i, a in enumerate(args) if a == "--set"])
        for s in spaces:
            got, want = reduce(getattr, s.key.split("."), cfg), s.choices[pick[s.name]]
            assert (type(got), got) == (type(want), want), (s.key, listed[s.name][pick[s.name]])


TRIAL_VALUES = [
    ("null", "training.max_steps", None),
    ("int", "training.max_steps", 100),
    ("true", "training.gather_across_devices", True),
    ("false", "training.gather_across_devices", False),
    ("float", "training.max_grad_norm", 1e-05),
    ("whole-float", "training.max_grad_norm", 3.0),
    ("inf", "training.max_grad_norm", float("inf")),
    ("minus-inf", "training.max_grad_norm", float("-inf")),
    ("spaces", "data.train.columns.query", "a b"),
    ("text-of-null", "data.train.columns.query", "null"),
    ("leading-space", "data.train.columns.query", " lead"),
    ("empty", "data.train.columns.query", ""),
    ("single-quote", "data.train.columns.query", " it's"),
]


@pytest.mark.parametrize("key,value", [c[1:] for c in TRIAL_VALUES], ids=[c[0] for c in TRIAL_VALUES])
def test_a_rendered_trial_value_reads_back_through_set(key, value):
    """Each kind of value (the schema's own limits aside: ``.inf`` is no max_grad_norm) round-trips through
    the trainer's ``--set`` reader as written."""
    from operator_cli.kube.kinds.sweeps import trial_value
    from trainer.config.overrides import parse_override

    got = parse_override(f"{key}={trial_value(key, value)}")[1]
    assert (type(got), got) == (type(value), value)


@pytest.mark.parametrize("value", ['say "hi"', "a\\b", "a\nb"], ids=["double-quote", "backslash", "newline"])
def test_a_value_the_controller_cannot_paste_is_one_line(value):
    """Katib pastes a value into the trial's JSON as it is: one that would change or break it is refused."""
    from operator_cli.kube.kinds.sweeps import trial_value

    with pytest.raises(CliError, match="cannot be written so that a trial's --set reads it back") as e:
        trial_value("data.train.columns.query", value)
    assert "\n" not in e.value.message


def test_the_optimizationjob_is_valid_and_templated_as_the_kep_says():
    objects = SWEEPS["optimizationjob"].render(_sweep("grid", api="trainjob"))
    schemas.validate_all(objects)
    spec = objects[-1]["spec"]
    assert spec["searchAlgorithm"] == {"grid": {}} and spec["numTrials"] == 4
    assert spec["parameters"][1] == {
        "name": "training_max_steps",
        "searchSpace": {"categorical": {"choices": ["2", "3"]}},
    }
    args = spec["trainJobTemplate"]["spec"]["trainer"]["args"]
    assert "training.learning_rate={{.training_learning_rate}}" in args


REFUSED = [
    ("katib-trainjob", "katib", {"api": "trainjob"}, "--api trainjob"),
    ("optjob-pytorchjob", "optimizationjob", {}, "TrainJob trials"),
    ("optjob-claim", "optimizationjob", {"api": "trainjob", "pvc": "shared"}, "shared claim"),
]


@pytest.mark.parametrize("engine,job,message", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_what_an_engine_cannot_express_is_one_line(engine, job, message):
    with pytest.raises(CliError, match=re.escape(message)):
        SWEEPS[engine].render(_sweep(**job))


def test_dry_run_prints_what_submit_would_create(config):
    res = _invoke(
        [
            "tune",
            "--config",
            str(config),
            "--name",
            "sweep",
            *PARAMS,
            "--dry-run=client",
            "-o",
            "yaml",
            "--gpus-per-node",
            "0",
        ]
    )
    assert res.exit_code == 0, res.output
    objects = list(yaml.safe_load_all(res.stdout))
    assert objects == SWEEPS["katib"].render(_sweep_of(config))


def test_set_reaches_every_trials_config(config):
    """``--set`` changes the sweep's config as it changes a job's (it was read from --config alone and dropped):
    the Experiment's ConfigMap, and the text a local trial's config is made from (the same ``config_text``)."""
    sets = ["--set", "training.seed=1", "--set", "training.max_steps=6"]
    res = _invoke(["tune", "--config", str(config), "--name", "sweep", *PARAMS, *sets, "--dry-run=client"])
    assert res.exit_code == 0, res.output
    configmap = list(yaml.safe_load_all(res.stdout))[0]
    training = yaml.safe_load(configmap["data"]["train.yaml"])["training"]
    assert (training["seed"], training["max_steps"]) == (1, 6)


def _sweep_of(config: Path) -> SweepSpec:
    job = JobSpec(name="sweep", config_text=without_export(config.read_text()), gpus_per_node=0)
    return SweepSpec(job=job, params=(parse_space(PARAMS[1]), parse_space(PARAMS[3])), config_text=config.read_text())


# ---- the trainer's side -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override,message",
    [
        ("training.learning_rate=fast", "learning_rate"),
        ("training.max_steps.x=1", "'training.max_steps' is a value"),
        ("Training.x=1", "unknown key 'Training'; did you mean 'training'?"),
        ("training.max_steps", "KEY=VALUE"),
    ],
    ids=["value", "section", "key", "syntax"],
)
def test_a_bad_set_is_one_line_and_exit_2(tmp_path, capsys, override, message):
    from trainer.cli import main

    (tmp_path / "train.yaml").write_text(CONFIG.replace("export: {destination: s3://bucket/models/best/}\n", ""))
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level  # main() sets up the trainer's logging on this stderr
    try:
        assert main(["--config", str(tmp_path / "train.yaml"), "--set", override]) == 2
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


# ---- a local sweep's record: the best is the best of what the trials wrote ----------------------------------


def _finished(root: Path, trial: str, ndcg: float, done: bool = True) -> None:
    out = root / trial / "output" / "quickstart"
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps({"after": {"ndcg@10": ndcg, "mrr@10": 1 - ndcg}}))
    if done:
        (out / "done.json").write_text("{}")


def test_status_names_the_best_of_the_trials_own_metrics(tmp_path):
    from operator_cli.tune.local import _prepare, sweep_root

    sweep = _sweep("grid")
    root = sweep_root(tmp_path, "sweep")
    _prepare(sweep, root)  # sweep.json and the trials' workspaces, as a run lays them out
    _finished(root, "sweep-t1", 0.31)
    _finished(root, "sweep-t2", 0.52)
    _finished(root, "sweep-t3", 0.90, done=False)  # killed before done.json: not a result
    (root / "sweep-t4" / "trial.json").write_text(json.dumps({"state": "Succeeded", "metric": 0.99}))  # a claim
    res = _invoke(["tune", "status", "sweep", "--workdir", str(tmp_path), "-o", "json"])
    assert res.exit_code == 0, res.output
    record = json.loads(res.output)
    assert record["best"]["name"] == "sweep-t2" and record["best"]["metric"] == 0.52
    states = {t["name"]: t["state"] for t in record["trials"]}
    assert states == {"sweep-t1": "Succeeded", "sweep-t2": "Succeeded", "sweep-t3": "Pending", "sweep-t4": "Failed"}
    min_goal = json.loads((root / "sweep.json").read_text()) | {"goal": "min"}
    (root / "sweep.json").write_text(json.dumps(min_goal))
    assert (
        json.loads(_invoke(["tune", "status", "sweep", "--workdir", str(tmp_path), "-o", "json"]).output)["best"][
            "name"
        ]
        == "sweep-t1"
    )
    table = _invoke(["tune", "status", "sweep", "--workdir", str(tmp_path)]).output
    assert "best so far: sweep-t1 ndcg@10 0.3100" in table


def test_a_rerun_must_ask_for_the_same_sweep(tmp_path):
    from operator_cli.tune.local import _prepare, sweep_root

    _prepare(_sweep("grid"), sweep_root(tmp_path, "sweep"))
    other = _sweep("grid")
    other = SweepSpec(job=other.job, params=other.params, config_text=other.config_text, algorithm="grid", seed=8)
    with pytest.raises(CliError, match="was started with another seed"):
        _prepare(other, sweep_root(tmp_path, "sweep"))
