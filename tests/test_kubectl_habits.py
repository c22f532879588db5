"""kubectl's habits (issue 43, item 8): ``-o`` only a format, ``--dry-run=client|server``, durations as kubectl
writes them, one meaning per flag name, grouped help; and what render/submit say about a new claim (item 1)."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from operator_cli.cli import cli
from tests.helpers.kube_emulator import Emulator

LOCAL_DATA = "data:\n  train: {path: data/train.jsonl}\ntraining: {per_device_batch_size: 32}\n"
REMOTE_DATA = "data:\n  train: {path: s3://bucket/train.jsonl}\ntraining: {per_device_batch_size: 32}\n"


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text(LOCAL_DATA)
    return path


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _one_line(res, code: int = 2) -> str:
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert res.exit_code == code and len(errors) == 1 and "Traceback" not in res.output, res.output
    return errors[0]


@pytest.mark.parametrize("output", ["wide", "name", "manifests/"], ids=["wide", "name", "a-directory"])
def test_render_o_is_only_a_format(config, tmp_path, output, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = invoke("render", "--config", str(config), "-o", output)
    assert f"-o must be one of yaml, json, got {output!r}" in _one_line(res)
    assert list(tmp_path.iterdir()) == [config]  # 0.3 made a directory named after -o's value


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--active-deadline", "48h"], ("activeDeadlineSeconds", 172800)),
        (["--ttl-after-finished", "90m"], ("ttlSecondsAfterFinished", 5400)),
        (["--termination-grace-period", "2m30s"], ("terminationGracePeriodSeconds", 150)),
        (["--active-deadline", "3600"], ("activeDeadlineSeconds", 3600)),  # a bare number: seconds, as in 0.3
    ],
    ids=["deadline-hours", "ttl-minutes", "grace-compound", "bare-seconds"],
)
def test_durations_in_kubectl_form(config, args, expected):
    res = invoke("render", "--config", str(config), *args)
    assert res.exit_code == 0, res.output
    key, value = expected
    assert f"{key}: {value}\n" in res.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["render", "--active-deadline", "2 days"], "--active-deadline must be a duration like 30s, 10m or 1h30m"),
        (["submit", "--timeout", "10m"], "--timeout applies to --wait"),  # 10m parsed: 0.3 said "not a valid float"
        (["submit", "--wait", "--timeout", "soon"], "--timeout must be a duration like 30s, 10m or 1h30m"),
        (["submit", "--request-timeout", "20m"], "--request-timeout must be between 1s and 600s, got 1200s"),
    ],
    ids=["bad-deadline", "submit-timeout-10m", "bad-timeout", "request-timeout-range"],
)
def test_duration_errors_are_one_line(config, args, message):
    assert message in _one_line(invoke(*args, "--config", str(config)))


def test_fetch_timeout_is_renamed_not_reused():
    """--timeout is a wait (submit --wait); fetch's pod lifetime is --active-deadline, as a job's is."""
    assert "fetch --timeout is now --active-deadline" in _one_line(invoke("fetch", "demo", "--timeout", "600"))


def test_top_level_help_is_grouped_and_whole():
    res = invoke("--help")
    assert res.exit_code == 0
    text = res.output
    sections = ["Run a job:", "Follow it:", "Change it:", "Data on its claim:", "Set up a cluster:"]
    assert [text.index(s) for s in sections] == sorted(text.index(s) for s in sections)
    assert "..." not in text.split("Run a job:")[1]  # every summary whole, none cut
    for name in ("render", "submit", "local", "status", "upload", "fetch", "doctor", "runtime", "tune"):
        assert f"\n  {name} " in text


# ---- storage notes, --suspend, --dry-run=server ------------------------------------------------------------


def test_a_local_data_path_on_a_new_claim_names_both_ways(config):
    res = invoke("render", "--config", str(config), "--name", "demo", "--nodes", "2", "--pvc-size", "50Gi")
    assert res.exit_code == 0, res.output
    warning = next(line for line in res.stderr.splitlines() if line.startswith("warning:"))
    assert "data.train.path data/train.jsonl" in warning and "the new claim demo-workspace starts empty" in warning
    assert "submit with --suspend, then `colbert-k8s upload demo data/train.jsonl`" in warning
    assert "s3://" in warning and "https://" in warning
    note = next(line for line in res.stderr.splitlines() if line.startswith("note:"))
    assert "default StorageClass for ReadWriteMany" in note and "--storage-class" in note
    assert yaml.safe_load_all(res.stdout)  # the manifests stay clean on stdout


def test_no_warning_for_an_existing_claim_or_a_remote_source(config):
    res = invoke("render", "--config", str(config), "--pvc", "data", "--storage-class", "x")
    assert res.exit_code == 0 and "warning" not in res.stderr and "note:" not in res.stderr
    config.write_text(REMOTE_DATA)
    res = invoke("render", "--config", str(config), "--pvc-size", "5Gi", "--storage-class", "rwx")
    assert res.exit_code == 0 and "warning" not in res.stderr and "note:" not in res.stderr


def test_one_pod_on_an_empty_dir_is_warned_too(config):
    res = invoke("render", "--config", str(config), "--name", "demo")
    assert "warning: data.train.path data/train.jsonl resolve(s) under /workspace, an emptyDir" in res.stderr


@pytest.mark.parametrize("api,path", [("pytorchjob", ("runPolicy", "suspend")), ("trainjob", ("suspend",))])
def test_submit_suspend_creates_the_job_suspended(config, api, path):
    res = invoke("submit", "--config", str(config), "--api", api, "--pvc-size", "1Gi", "--suspend", "--dry-run")
    assert res.exit_code == 0, res.output
    job = list(yaml.safe_load_all(res.stdout))[-1]
    value = job["spec"]
    for key in path:
        value = value[key]
    assert value is True


def test_submit_dry_run_server_sends_dry_run_all_and_stores_nothing(config, tmp_path):
    """As TorchX's dry run: every object is sent with ?dryRun=All, the server's answer is printed."""
    with Emulator(tmp_path) as api:
        args = ["submit", "--config", str(config), "--name", "demo", "--pvc-size", "1Gi", "--dry-run=server"]
        res = invoke(*args, "--kubeconfig", str(api.kubeconfig))
        assert res.exit_code == 0, res.output
        sent = [(r.resource.plural, r.params.get("dryRun")) for r in api.emu.dry_runs]
        assert sent == [("configmaps", "All"), ("persistentvolumeclaims", "All"), ("pytorchjobs", "All")]
        assert api.objects("pytorchjobs") == [] and api.objects("configmaps") == []
        answered = list(yaml.safe_load_all(res.stdout))
        assert [o["kind"] for o in answered] == ["ConfigMap", "PersistentVolumeClaim", "PyTorchJob"]
        assert all(o["metadata"].get("uid") for o in answered)  # the server's answer, not the local render
        assert "created" not in res.stdout
