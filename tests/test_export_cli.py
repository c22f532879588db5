"""The export's CLI and chart side: the destination's credentials are named at submit (and by the chart's schema,
the same rule), and a job with an export renders the same objects from both."""

from __future__ import annotations

import helm_python
import pytest
import yaml

from operator_cli.errors import CliError
from operator_cli.render import render
from operator_cli.spec import JobSpec, SecretRef
from tests.helpers.chart import CONFIG, helm_render, normalise
from tests.helpers.schemas import validate_all

HUB = {**CONFIG, "export": {"destination": "hf://my-org/colbert-run", "private": True}}
S3 = {**CONFIG, "export": {"destination": "s3://models/runs/one/", "include": ["checkpoint"]}}

CASES = [
    # name, config, CLI options, chart values, what is missing (None: accepted)
    (
        "hub-with-token",
        HUB,
        {"secret_env": {"HF_TOKEN": SecretRef("hf", "token")}},
        {"secretEnv": {"HF_TOKEN": {"secret": "hf", "key": "token"}}},
        None,
    ),
    ("hub-without-token", HUB, {}, {}, "needs HF_TOKEN"),
    (
        "hub-service-account-is-not-a-token",
        HUB,
        {"service_account": "trainer"},
        {"serviceAccount": {"name": "trainer"}},
        "needs HF_TOKEN",
    ),
    (
        "s3-with-keys",
        S3,
        {
            "secret_env": {
                "AWS_ACCESS_KEY_ID": SecretRef("s3", "id"),
                "AWS_SECRET_ACCESS_KEY": SecretRef("s3", "secret"),
            }
        },
        {
            "secretEnv": {
                "AWS_ACCESS_KEY_ID": {"secret": "s3", "key": "id"},
                "AWS_SECRET_ACCESS_KEY": {"secret": "s3", "key": "secret"},
            }
        },
        None,
    ),
    (
        "s3-half-the-keys",
        S3,
        {"secret_env": {"AWS_ACCESS_KEY_ID": SecretRef("s3", "id")}},
        {"secretEnv": {"AWS_ACCESS_KEY_ID": {"secret": "s3", "key": "id"}}},
        "needs credentials",
    ),
    ("s3-workload-identity", S3, {"service_account": "trainer"}, {"serviceAccount": {"name": "trainer"}}, None),
    ("s3-nothing", S3, {}, {}, "needs credentials"),
]


@pytest.mark.parametrize("name,config,cli_opts,values,missing", CASES, ids=[c[0] for c in CASES])
def test_cli_and_chart_agree_on_an_exports_credentials(name, config, cli_opts, values, missing):
    text = yaml.safe_dump(config)
    if missing:
        with pytest.raises(CliError) as e:
            JobSpec(name="job", config_text=text, **cli_opts)
        assert missing in e.value.message and "--secret-env" in e.value.hint
        with pytest.raises(helm_python.HelmError):
            helm_render({**values, "config": config})
        return
    from_cli = render(JobSpec(name="job", config_text=text, **cli_opts))
    from_helm = helm_render({**values, "config": config})
    validate_all(from_helm)
    assert normalise(from_helm) == normalise(from_cli)
    shipped = yaml.safe_load(from_cli[0]["data"]["train.yaml"])
    assert shipped["export"] == config["export"]  # the export travels in the config, as every key does


def test_render_names_the_missing_secret_in_one_line(tmp_path):
    import subprocess
    import sys

    from tests.helpers import ROOT

    (tmp_path / "train.yaml").write_text(yaml.safe_dump(HUB))
    res = subprocess.run(
        [sys.executable, "-m", "operator_cli.cli", "render", "--config", str(tmp_path / "train.yaml"), "--name", "j"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "export.destination hf://my-org/colbert-run needs HF_TOKEN" in res.stderr
    assert "--secret-env HF_TOKEN=SECRET/KEY" in res.stderr
