"""Registration (trainer/serve/register.py) against a stand-in of the Kubeflow Model Registry's REST API
(tests/helpers/registry.py): the version points at the export and carries its figures, and it is made once, whatever
restarts in between."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from tests.helpers.local import local_command, s3_flags
from tests.helpers.registry import RegistryStandIn
from tests.helpers.stores import moto_available
from trainer.config.load import parse_config
from trainer.serve.register import MARKER, RegisterFailed, after_export, entry_for, register
from trainer.serve.registry import API, Registry, RegistryError

METRICS = {
    "before": {"ndcg@10": 0.41},
    "after": {"ndcg@10": 0.52},
    "index": {"ndcg@10": 0.5},
    "steps": 26,
    "global_batch": 32,
    "world_size": 2,
    "train_data": "s3://data/train.jsonl",
}


@pytest.fixture
def registry():
    stand_in = RegistryStandIn(token="registry-token-123")
    yield stand_in
    stand_in.close()


def _rcfg(**keys):
    cfg = parse_config(
        {
            "data": {"train": {"path": "t.jsonl"}},
            "export": {"destination": "s3://models/run-1/"},
            "register": {"name": "colbert-docs", **keys},
        }
    )
    return cfg.registration


def _entry(**keys):
    return entry_for(_rcfg(**keys), "s3://models/run-1/", b'{"files": {}}\n', METRICS, "all-MiniLM-L6-v2", "run-1")


def test_a_version_points_at_the_export_and_carries_its_figures(registry):
    entry = _entry(version="v1", labels=["nfcorpus"], storage_key="s3-models", description="first")
    result = register(Registry(registry.url, "registry-token-123"), entry)
    assert result["created"] and len(registry.models) == 1 and len(registry.versions) == 1
    version = registry.versions[result["version_id"]]
    props = version["customProperties"]
    assert props["ndcg_at_10_after"] == {"metadataType": "MetadataDoubleValue", "double_value": 0.52}
    assert props["ndcg_at_10_before"]["double_value"] == 0.41 and props["ndcg_at_10_index"]["double_value"] == 0.5
    assert props["steps"] == {"metadataType": "MetadataIntValue", "int_value": "26"}
    assert props["base_model"]["string_value"] == "all-MiniLM-L6-v2" and props["job"]["string_value"] == "run-1"
    assert props["nfcorpus"] == {"metadataType": "MetadataStringValue", "string_value": ""}  # a label
    assert version["description"] == "first"
    (artifact,) = registry.artifacts[result["version_id"]]
    assert artifact["uri"] == "s3://models/run-1/" and artifact["storageKey"] == "s3-models"
    assert artifact["storagePath"] == "run-1/" and artifact["artifactType"] == "model-artifact"


def test_registering_again_finds_what_is_there_and_writes_nothing(registry):
    client = Registry(registry.url, "registry-token-123")
    first = register(client, _entry())
    posts = len(registry.posts())
    again = register(client, _entry())
    assert not again["created"] and again["version_id"] == first["version_id"]
    assert len(registry.posts()) == posts and len(registry.versions) == 1
    assert first["version"] == "run-1-" + hashlib.sha256(b'{"files": {}}\n').hexdigest()[:8]


def test_a_version_that_points_elsewhere_is_refused_in_one_line(registry):
    client = Registry(registry.url, "registry-token-123")
    register(client, _entry(version="v1"))
    # the same export (same manifest) copied to another prefix: the version is this export's, its artifact is not
    other = entry_for(_rcfg(version="v1"), "s3://models/run-2/", b'{"files": {}}\n', METRICS, "base", "run-2")
    with pytest.raises(RegistryError, match=r"version 'v1' of 'colbert-docs' exists and points at s3://models/run-1/"):
        register(client, other)


def test_a_refused_token_is_one_line_without_the_token(registry):
    with pytest.raises(RegistryError) as e:
        register(Registry(registry.url, "wrong-token-456"), _entry())
    assert "HTTP 401" in str(e.value) and "unauthorized" in str(e.value) and "456" not in str(e.value)
    with pytest.raises(RegistryError, match="no answer"):
        register(Registry("http://127.0.0.1:9"), _entry())


@pytest.fixture
def finished(tmp_path, tiny_model, registry, monkeypatch) -> object:
    """A finished job's output_dir and its config, the registry's endpoint and token in the environment."""
    out = tmp_path / "output"
    shutil.copytree(tiny_model, out / "final-model")
    (out / "metrics.json").write_text(json.dumps(METRICS))
    monkeypatch.setenv("MODEL_REGISTRY_URL", registry.url)
    monkeypatch.setenv("MODEL_REGISTRY_TOKEN", "registry-token-123")
    return parse_config(
        {
            "data": {"train": {"path": "t.jsonl"}},
            "output_dir": str(out),
            "export": {"destination": "s3://models/run-1/"},
            "register": {"name": "colbert-docs"},
        }
    )


def test_after_export_registers_once_and_a_restart_registers_nothing(finished, registry):
    first = after_export(finished)
    marker = json.loads((Path(finished.output_dir) / MARKER).read_text())
    assert marker["version_id"] == first["version_id"] and first["created"]
    posts, calls = len(registry.posts()), len(registry.calls)
    assert after_export(finished)["version_id"] == first["version_id"]
    assert len(registry.calls) == calls  # the marker: the registry is not even asked
    (Path(finished.output_dir) / MARKER).unlink()  # killed before the marker: the registry is asked, and says so
    again = after_export(finished)
    assert not again["created"] and len(registry.posts()) == posts and len(registry.versions) == 1


def test_a_registry_that_fails_is_retryable_and_one_line(finished, monkeypatch):
    monkeypatch.setenv("MODEL_REGISTRY_TOKEN", "wrong")
    with pytest.raises(RegisterFailed, match="register colbert-docs version output-.*HTTP 401"):
        after_export(finished)
    assert not (Path(finished.output_dir) / MARKER).exists()


def test_register_needs_export_in_the_config():
    from trainer.config.schema import ConfigError

    with pytest.raises(ConfigError, match="register needs an export section"):
        parse_config({"data": {"train": {"path": "t.jsonl"}}, "register": {"name": "m"}})


# ---- a `local` job with export: (moto) and register: (the stand-in), killed after the export -------------


@pytest.mark.skipif(moto_available() is not None, reason=str(moto_available()))
@pytest.mark.slow
def test_a_local_job_killed_after_the_export_registers_exactly_once(tmp_path, tiny_model, registry):
    """The done-when of issue 41: the job exports to S3 (moto) and registers in the stand-in, whose answer to the
    version's creation never comes (the registry did it): the job is killed there. The restart trains nothing,
    exports nothing, and ends with one model, one version, one artifact: the export's URI, with nDCG@10."""
    import os
    import random
    import subprocess

    import psutil
    import yaml

    from tests.helpers import ROOT, write_triplets
    from tests.helpers.stores import MotoS3
    from trainer.quickstart_data import TEST_MODULES, _triplets, write_beir

    s3 = MotoS3()
    s3.bucket("e2e-register")
    (tmp_path / "data").mkdir()
    write_triplets(tmp_path / "data" / "train.jsonl", 16)
    rows = _triplets(TEST_MODULES[:3], random.Random(0))
    write_beir(
        tmp_path / "data" / "beir", [(r["id"], r["positive"]) for r in rows], [(r["id"], r["query"]) for r in rows[:20]]
    )
    cfg = {
        "model": {"name_or_path": str(tiny_model), "query_length": 16, "document_length": 48},
        "data": {"train": {"path": "data/train.jsonl"}, "eval_beir": "data/beir"},
        "training": {"per_device_batch_size": 4, "max_steps": 2, "log_every": 1},
        "evaluation": {"before_training": True},
        "export": {"destination": "s3://e2e-register/tiny/"},
        "register": {"name": "colbert-e2e", "labels": ["test"]},
        "output_dir": "output",
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(cfg))
    to_registry = ("--secret-env", "MODEL_REGISTRY_TOKEN=registry/token", "--env", f"MODEL_REGISTRY_URL={registry.url}")
    flags = ("--nodes", "1", "--pvc-size", "1Gi", *s3_flags(s3.url), *to_registry)
    cmd = local_command(tmp_path / "train.yaml", "reg", tmp_path, *flags)
    env = {**os.environ, **s3.env, "MODEL_REGISTRY_TOKEN": "registry-token-123"}
    registry.stall = ("POST", "/registered_models/")  # the version is made; its answer never comes
    try:
        log = open(tmp_path / "first.log", "w")
        first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        assert registry.stalled.wait(400), (tmp_path / "first.log").read_text()[-3000:]
        children = psutil.Process(first.pid).children(recursive=True)
        first.kill()
        first.wait(30)
        psutil.wait_procs(children, timeout=60)
        registry.stall = None
        registry.release.set()
        assert len(registry.versions) == 1 and not (tmp_path / "output" / MARKER).exists()
        again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
        out = again.stdout + again.stderr
        assert again.returncode == 0, out[-3000:]
        assert "the job: done before" in out and "found, made by an earlier start" in out, out[-3000:]
        third = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
        assert third.returncode == 0 and "registered before" in third.stdout + third.stderr
    finally:
        s3.close()
    assert len(registry.models) == 1 and len(registry.versions) == 1
    (version,) = registry.versions.values()
    (artifact,) = registry.artifacts[version["id"]]
    assert artifact["uri"] == "s3://e2e-register/tiny/"
    after = json.loads((tmp_path / "output" / "metrics.json").read_text())["after"]["ndcg@10"]
    assert version["customProperties"]["ndcg_at_10_after"]["double_value"] == pytest.approx(after, abs=1e-6)
    assert "registry-token-123" not in (tmp_path / "first.log").read_text() + out


# ---- colbert-k8s register URI ------------------------------------------------------------------------------


def _export_dir(root: Path, tiny_model: Path) -> Path:
    """A local copy of an export: the model at the root, its card, metrics.json, the manifest last."""
    from trainer.storage.export import MANIFEST, manifest_for

    shutil.copytree(tiny_model, root)
    card = "---\nlibrary_name: PyLate\n---\n\n# run-9\n\nA model, fine-tuned from\n`org/base`.\n"
    (root / "README.md").write_text(card)
    (root / "metrics.json").write_text(json.dumps(METRICS))
    plan = {p.relative_to(root).as_posix(): p for p in root.rglob("*") if p.is_file()}
    (root / MANIFEST).write_text(json.dumps(manifest_for(plan), indent=2, sort_keys=True) + "\n")
    return root


def test_the_register_command_registers_an_export_once(tmp_path, tiny_model, registry):
    from click.testing import CliRunner

    from operator_cli.cli import cli
    from trainer.storage.export import PARTIAL

    export_dir = _export_dir(tmp_path / "export", tiny_model)
    args = ["register", str(export_dir), "--model", "colbert-docs", "--registry-url", registry.url, "--label", "x"]
    env = {"MODEL_REGISTRY_TOKEN": "registry-token-123"}
    first = CliRunner().invoke(cli, args, env=env)
    assert first.exit_code == 0, first.output
    assert first.stdout.startswith("registered: colbert-docs version run-9-")
    again = CliRunner().invoke(cli, args, env=env)
    assert again.exit_code == 0 and again.stdout.startswith("already registered: colbert-docs")
    (version,) = registry.versions.values()
    assert version["customProperties"]["base_model"]["string_value"] == "org/base"
    assert registry.artifacts[version["id"]][0]["uri"] == str(export_dir.resolve())
    (export_dir / PARTIAL).write_text("")
    half = CliRunner().invoke(cli, args, env=env)
    assert half.exit_code != 0 and "an export is being written there" in half.output
    assert len(half.output.strip().splitlines()) == 2 and "Traceback" not in half.output  # error + hint


# ---- a version is this export's by its manifest digest -----------------------------------------------------


def test_another_export_under_the_same_version_name_is_refused_naming_both_digests(registry):
    client = Registry(registry.url, "registry-token-123")
    first = register(client, _entry(version="v1"))
    other_manifest = b'{"files": {"model.safetensors": {}}}\n'  # another export, written to the same URI
    other = entry_for(_rcfg(version="v1"), "s3://models/run-1/", other_manifest, METRICS, "base", "run-2")
    with pytest.raises(RegistryError) as e:
        register(client, other)
    ours, theirs = hashlib.sha256(b'{"files": {}}\n').hexdigest(), hashlib.sha256(other_manifest).hexdigest()
    line = str(e.value)
    assert "\n" not in line and ours in line and theirs in line and "set register.version" in line, line
    assert list(registry.versions) == [first["version_id"]]  # nothing added, nothing changed
    assert registry.versions[first["version_id"]]["customProperties"]["export_manifest_sha256"]["string_value"] == ours


def test_a_restart_after_another_export_to_the_same_uri_is_refused(finished, registry):
    """The job's path: registered once; the output changes (a new export at the same URI, the same version name):
    the registry keeps the first export's figures, so the second is refused, not taken for "registered before"."""
    from trainer.serve.register import RegisterFailed

    finished = finished.model_copy(update={"registration": finished.registration.model_copy(update={"version": "v1"})})
    after_export(finished)
    metrics = Path(finished.output_dir) / "metrics.json"
    metrics.write_text(json.dumps({**METRICS, "after": {"ndcg@10": 0.61}}))
    with pytest.raises(RegisterFailed, match=r"version 'v1' of 'colbert-docs' exists for another export"):
        after_export(finished)
    assert len(registry.versions) == 1


# ---- MODEL_REGISTRY_URL with a password: refused, never printed ---------------------------------------------

_WITH_PASSWORD = [
    pytest.param("http://admin:hunter2@registry.example/", id="no-port"),
    pytest.param("https://admin:hunter2@registry.example:8443/", id="port"),
    pytest.param("http://admin:hun/ter2@registry.example/", id="slash-in-password"),
    pytest.param("http://:hunter2@registry.example/", id="password-only"),
]


@pytest.mark.parametrize("url", _WITH_PASSWORD)
def test_a_password_in_model_registry_url_is_refused_without_printing_it(url, monkeypatch):
    from trainer.config.schema import ConfigError
    from trainer.serve.register import preflight

    monkeypatch.setenv("MODEL_REGISTRY_URL", url)
    secret = url.split(":")[2].rpartition("@")[0]
    with pytest.raises(RegistryError) as e:
        Registry.from_env(None)
    assert "MODEL_REGISTRY_URL" in str(e.value) and "holds a user name or password" in str(e.value)
    assert secret not in str(e.value) and "hunter" not in str(e.value)
    cfg = parse_config(
        {"data": {"train": {"path": "t.jsonl"}}, "export": {"destination": "s3://m/r/"}, "register": {"name": "m"}}
    )
    with pytest.raises(ConfigError) as e:  # at the job's start, before hours of training
        preflight(cfg)
    assert "hunter" not in str(e.value) and "\n" not in str(e.value)


def test_a_password_in_model_registry_url_never_reaches_the_job_or_the_cli(finished, tmp_path, tiny_model, monkeypatch):
    from click.testing import CliRunner

    from operator_cli.cli import cli

    monkeypatch.setenv("MODEL_REGISTRY_URL", "http://admin:hunter2@127.0.0.1/")
    with pytest.raises(RegisterFailed) as e:
        after_export(finished)
    assert "hunter2" not in str(e.value) and "holds a user name or password" in str(e.value)
    export_dir = _export_dir(tmp_path / "export", tiny_model)
    res = CliRunner().invoke(cli, ["register", str(export_dir), "--model", "m"])
    assert res.exit_code not in (0, 70) and "internal error" not in res.output, res.output
    assert "hunter2" not in res.output and "MODEL_REGISTRY_URL" in res.output


# ---- a 200 of another shape is the registry's fault, in one line ---------------------------------------------

_FIND = f"GET {API}/registered_model"
_ODD = [
    pytest.param(("GET", "/registered_model", "application/json", b"{}"), _FIND, "id: Field required", id="empty"),
    pytest.param(("GET", "/registered_model", "application/json", b"[]"), _FIND, "got a JSON list", id="list"),
    pytest.param(("GET", "/registered_model", "application/json", b'"ok"'), _FIND, "got a JSON string", id="text"),
    pytest.param(
        ("GET", "/registered_model", "text/html", b"<html>Sign in</html>"), _FIND, "answered text/html", id="page"
    ),
    pytest.param(
        ("POST", "/registered_models/", "application/json", b'{"name": "v"}'),
        f"POST {API}/registered_models/1/versions",
        "id: Field required",
        id="version-without-id",
    ),
    pytest.param(
        ("GET", "/model_versions/", "application/json", b'{"items": {"uri": "x"}}'),
        f"GET {API}/model_versions/2/artifacts",
        "items: Input should be a valid list",
        id="artifacts-not-a-list",
    ),
]


@pytest.mark.parametrize(("odd", "call", "problem"), _ODD)
def test_an_answer_of_another_shape_blames_the_registry_in_one_line(odd, call, problem, registry):
    registry.odd = odd
    with pytest.raises(RegistryError) as e:
        register(Registry(registry.url, "registry-token-123"), _entry())
    line = str(e.value)
    assert line.startswith(call) and problem in line and "\n" not in line, line
    assert "MODEL_REGISTRY_URL is the Model Registry's REST endpoint" in line, line


def test_an_answer_of_another_shape_is_the_registrys_fault_not_the_exports(finished, tmp_path, tiny_model, registry):
    from click.testing import CliRunner

    from operator_cli.cli import cli

    registry.odd = ("GET", "/registered_model", "application/json", b"{}")
    with pytest.raises(RegisterFailed) as e:
        after_export(finished)
    assert str(e.value).startswith("register colbert-docs version ") and _FIND in str(e.value), str(e.value)
    assert "KeyError" not in str(e.value)
    export_dir = _export_dir(tmp_path / "export", tiny_model)
    args = ["register", str(export_dir), "--model", "m", "--registry-url", registry.url]
    res = CliRunner().invoke(cli, args, env={"MODEL_REGISTRY_TOKEN": "registry-token-123"})
    assert res.exit_code not in (0, 70) and "internal error" not in res.output and _FIND in res.output, res.output
