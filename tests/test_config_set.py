"""`--set KEY=VALUE` on render, submit and local (issue 43): applied to the config the job ships, checked
against the trainer's schema, an unknown key one line with the nearest one; and ``colbert-train --set`` (a sweep
trial's values) read by the same code, so it applies and refuses alike (issue 44)."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from operator_cli.cli import cli
from tests.helpers import ROOT
from trainer.config.load import load_yaml, parse_config
from trainer.config.overrides import with_overrides
from trainer.config.schema import ConfigError

QUICKSTART = (ROOT / "examples" / "quickstart.yaml").read_text()

APPLIED = [
    ("int", ["training.max_steps=100"], ("training", "max_steps"), 100),
    ("yaml-1.2-float", ["training.learning_rate=5e-5"], ("training", "learning_rate"), 5e-5),
    ("empty-list", ["data.train.columns.negatives=[]"], ("data", "train", "columns", "negatives"), []),
    ("text-field-keeps-text", ["tracking.run_name=2024"], ("tracking", "run_name"), "2024"),
    ("string-that-looks-like-a-float", ["model.name_or_path=1e5"], ("model", "name_or_path"), "1e5"),
    ("new-section", ["index.nbits=2"], ("index", "nbits"), 2),
    ("last-wins", ["training.max_steps=3", "training.max_steps=4"], ("training", "max_steps"), 4),
    ("mapping", ["mine={retriever: bm25, negatives: 2}"], ("mine", "negatives"), 2),
]


@pytest.mark.parametrize("name,overrides,path,value", APPLIED, ids=[a[0] for a in APPLIED])
def test_set_is_applied_with_yaml_types(name, overrides, path, value):
    text = with_overrides(QUICKSTART, overrides, "examples/quickstart.yaml")
    data = load_yaml(text)
    for key in path:
        data = data[key]
    assert data == value and type(data) is type(value)
    parse_config(load_yaml(text))  # what the job ships is a valid config
    assert load_yaml(text)["model"]["query_length"] == 32  # the rest of the file is kept


def test_no_set_keeps_the_file_as_written():
    assert with_overrides(QUICKSTART, (), "q.yaml") == QUICKSTART  # comments and all


REFUSED = [
    ("typo", "training.max_step=100", "--set: unknown key 'training.max_step'; did you mean 'training.max_steps'?"),
    ("no-section", "max_steps=100", "--set: unknown key 'max_steps'; did you mean 'training.max_steps'?"),
    ("section-typo", "trainin.max_steps=1", "--set: unknown key 'trainin'; did you mean 'training'?"),
    ("removed", "mine.round_start=base", "--set: 'mine.round_start' was removed in 0.4.0; delete the --set"),
    (
        "removed-loss-key",
        "loss.mask_labelled_positives=true",
        "--set: 'loss.mask_labelled_positives' was removed in 0.5.0; delete the --set",
    ),
    ("value-not-section", "training.max_steps.x=1", "'training.max_steps' is a value, not a section"),
    ("out-of-range", "training.max_steps=0", "'training.max_steps': Input should be greater than or equal to 1"),
    ("wrong-type", "training.learning_rate=fast", "'training.learning_rate': Input should be a valid number"),
    ("no-equals", "training.max_steps", "--set takes KEY=VALUE"),
    ("credential", "export.destination=s3://user:pw@bucket/x/", "holds a URL with user:password@"),
    ("token-as-key", "hf_" + "Ab1" * 12, "--set takes KEY=VALUE"),
    ("newline-in-key", "training.max\nsteps=1", "--set takes KEY=VALUE"),
]


@pytest.mark.parametrize("name,item,message", REFUSED, ids=[r[0] for r in REFUSED])
def test_a_bad_set_is_one_line(name, item, message):
    with pytest.raises(ConfigError) as e:
        with_overrides(QUICKSTART, [item], "q.yaml")
    assert message in str(e.value) and "\n" not in str(e.value)
    assert "pw@" not in str(e.value) and "Ab1Ab1" not in str(e.value)  # neither a value nor a token is echoed


def _trainer_config(tmp_path, items: list[str]):
    """The config ``colbert-train --config FILE --set ...`` trains with (``trainer/cli.py``)."""
    from trainer.cli import _load

    (tmp_path / "train.yaml").write_text(QUICKSTART)
    return _load(str(tmp_path / "train.yaml"), items)


@pytest.mark.parametrize("name,overrides,path,value", APPLIED, ids=[a[0] for a in APPLIED])
def test_the_trainer_reads_set_as_the_cli_does(tmp_path, name, overrides, path, value):
    """One reading of ``--set``: a sweep trial's ``colbert-train --set`` gives the config a job's ``--set`` ships
    (``[]`` a list, ``run_name=2024`` the text, a new section created)."""
    shipped = parse_config(load_yaml(with_overrides(QUICKSTART, overrides, "q.yaml")))
    assert _trainer_config(tmp_path, overrides) == shipped


@pytest.mark.parametrize("name,item,message", REFUSED, ids=[r[0] for r in REFUSED])
def test_the_trainer_refuses_a_bad_set_in_the_cli_s_words(tmp_path, name, item, message):
    with pytest.raises(ConfigError) as e:
        _trainer_config(tmp_path, [item])
    assert message in str(e.value) and "\n" not in str(e.value)
    assert "pw@" not in str(e.value) and "Ab1Ab1" not in str(e.value)


def _render(tmp_path, *extra: str, command: str = "render"):
    config = tmp_path / "train.yaml"
    config.write_text(QUICKSTART)
    args = [command, "--config", str(config), "--name", "q", *extra]
    if command == "submit":
        args.append("--dry-run")
    return CliRunner().invoke(cli, args)


@pytest.mark.parametrize("command", ["render", "submit"])
def test_render_and_submit_ship_the_config_with_set_applied(tmp_path, command):
    sets = [
        "--set",
        "training.max_steps=100",
        "--set",
        "data.eval_split=dev",
        "--set",
        "training.per_device_batch_size=8",
    ]
    res = _render(tmp_path, *sets, command=command)
    assert res.exit_code == 0, res.output
    objects = [o for o in yaml.safe_load_all(res.stdout) if o]
    shipped = load_yaml(objects[0]["data"]["train.yaml"])
    assert shipped["training"]["max_steps"] == 100 and shipped["data"]["eval_split"] == "dev"
    assert command == "submit" or "global batch 8" in res.output  # render's scale line is the overridden config's


def test_a_bad_set_fails_render_in_one_line(tmp_path):
    res = _render(tmp_path, "--set", "training.max_step=100")
    assert res.exit_code == 2
    assert res.output.splitlines()[0] == (
        "error: --set: unknown key 'training.max_step'; did you mean 'training.max_steps'?"
    )


def test_set_is_an_option_of_render_submit_and_local():
    for command in ("render", "submit", "local"):
        text = CliRunner().invoke(cli, [command, "--help"], terminal_width=200).output
        assert "--set KEY=VALUE" in text, command
