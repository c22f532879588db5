"""Export (trainer/storage/export.py) over real protocols: moto's S3 server and a Hub stand-in for huggingface_hub's own
client (tests/helpers/hub.py); and the model card (trainer/storage/card.py), parsed by huggingface_hub's ModelCard."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers.hub import READ_TOKEN, HubStandIn
from tests.helpers.local import local_command, s3_flags
from tests.helpers.stores import MotoS3, moto_available
from trainer.config.load import parse_config
from trainer.config.schema import ConfigError
from trainer.storage import export

BASE = {"data": {"train": {"path": "t.jsonl"}}, "training": {"max_steps": 1}}


def _cfg(out: Path, destination: str, **export_keys) -> object:
    return parse_config({**BASE, "output_dir": str(out), "export": {"destination": destination, **export_keys}})


@pytest.fixture
def outputs(tmp_path, tiny_model) -> Path:
    """An output_dir as a finished job leaves it: a real model directory, metrics.json, a checkpoint."""
    out = tmp_path / "output"
    shutil.copytree(tiny_model, out / "final-model")
    (out / "final-model" / "README.md").write_text("---\nlibrary_name: PyLate\n---\n# card\n")
    (out / "metrics.json").write_text(json.dumps({"after": {"ndcg@10": 0.5}}))
    (out / "checkpoints" / "step-00000002").mkdir(parents=True)
    (out / "checkpoints" / "step-00000002" / "state.pt").write_bytes(b"state" * 1000)
    return out


def _local_files(out: Path) -> dict[str, bytes]:
    model = out / "final-model"
    files = {p.relative_to(model).as_posix(): p.read_bytes() for p in model.rglob("*") if p.is_file()}
    return {**files, "metrics.json": (out / "metrics.json").read_bytes()}


# ---- the destination's rules ----------------------------------------------------------------------

BAD = [
    ("ftp", {"destination": "ftp://host/x"}, "ftp:// is not an export destination"),
    ("https", {"destination": "https://example.com/m"}, "https:// is not an export destination"),
    ("no bucket", {"destination": "s3:///prefix"}, "s3:// names no bucket"),
    ("hub one part", {"destination": "hf://just-a-name"}, "must name a Hub model repository as hf://ORG/NAME"),
    ("hub dataset", {"destination": "hf://datasets/org/x"}, "names a dataset or Space"),
    ("dot-dot prefix", {"destination": "s3://b/a/../c"}, "the prefix holds '.' or '..'"),
    ("revision on s3", {"destination": "s3://b/p", "revision": "dev"}, "apply to hf:// destinations only"),
    ("replace on s3", {"destination": "s3://b/p", "replace": True}, "apply to hf:// destinations only"),
    ("unknown include", {"destination": "s3://b/p", "include": ["tokenizer"]}, "export.include"),
    ("index not built", {"destination": "s3://b/p", "include": ["index"]}, "needs an index section"),
    ("best never kept", {"destination": "s3://b/p", "include": ["best-model"]}, "needs evaluation.every_steps"),
]


@pytest.mark.parametrize("name,section,message", BAD, ids=[b[0] for b in BAD])
def test_a_bad_export_section_is_one_line(name, section, message):
    with pytest.raises(ConfigError) as e:
        parse_config({**BASE, "export": section})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_destination_with_credentials_is_refused_without_showing_them():
    with pytest.raises(ConfigError) as e:
        parse_config({**BASE, "export": {"destination": "s3://AKIAEXAMPLE:topsecret@bucket/p"}})
    assert "topsecret" not in str(e.value) and "--secret-env" in str(e.value)


# ---- S3 (moto) --------------------------------------------------------------------------------------

s3_only = pytest.mark.skipif(moto_available() is not None, reason=str(moto_available()))


@pytest.fixture(scope="module")
def s3():
    server = MotoS3()
    yield server
    server.close()


@pytest.fixture
def s3_env(s3, monkeypatch):
    for k, v in s3.env.items():
        monkeypatch.setenv(k, v)
    return s3


@s3_only
def test_s3_export_is_the_output_byte_for_byte_with_the_manifest(s3_env, outputs):
    s3_env.bucket("exp-a")
    cfg = _cfg(outputs, "s3://exp-a/runs/one/", include=["checkpoint"])
    export.preflight(cfg)
    result = export.run(cfg)
    remote = s3_env.objects("exp-a", "runs/one/")
    manifest = json.loads(remote.pop(export.MANIFEST))
    want = {**_local_files(outputs), "checkpoint/state.pt": b"state" * 1000}
    assert remote == want  # the model directory at the root, metrics.json, the last checkpoint
    import hashlib

    assert manifest["files"] == {n: {"size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for n, b in want.items()}
    assert result["bytes_sent"] == result["bytes"] == sum(len(b) for b in want.values())
    again = export.run(cfg)  # a restart after success: nothing is sent
    assert again["bytes_sent"] == 0


def _dying_put(monkeypatch, at: int) -> list[str]:
    """obstore.put failing at its ``at``-th call, as a connection reset does (after the store's retries)."""
    import obstore

    real_put, calls = obstore.put, []

    def put(store, key, data, **kw):
        calls.append(key)
        if len(calls) == at:
            raise ConnectionResetError("connection reset by peer")
        return real_put(store, key, data, **kw)

    monkeypatch.setattr(obstore, "put", put)
    return calls


@s3_only
def test_an_interrupted_s3_export_shows_no_manifest_and_a_restart_sends_only_the_rest(s3_env, outputs, monkeypatch):
    """The manifest goes last: a reader never trusts a half export. The journal skips what the first
    attempt sent, while an object replaced behind the job's back is sent again."""
    import obstore

    s3_env.bucket("exp-b")
    cfg = _cfg(outputs, "s3://exp-b/m/")
    real_put = obstore.put
    calls = _dying_put(monkeypatch, at=4)  # the marker, two files, then the link breaks
    with pytest.raises(export.ExportFailed) as e:
        export.run(cfg)
    assert "uploading" in str(e.value) and "connection reset" in str(e.value)
    assert calls[0] == "m/" + export.PARTIAL
    first_two = calls[1:3]
    half = s3_env.objects("exp-b", "m/")
    assert export.MANIFEST not in half and export.PARTIAL in half and len(half) == 3  # a reader refuses it
    monkeypatch.setattr(obstore, "put", real_put)
    replaced = first_two[1].removeprefix("m/")
    s3_env.put("exp-b", first_two[1], b"x" * len(_local_files(outputs)[replaced]))  # same size, other bytes
    result = export.run(cfg)
    remote = s3_env.objects("exp-b", "m/")
    remote.pop(export.MANIFEST)
    assert export.PARTIAL not in remote
    local = _local_files(outputs)
    assert remote == local
    skipped = len(local[first_two[0].removeprefix("m/")])
    assert result["bytes_sent"] == result["bytes"] - skipped  # only the journal's proven file was skipped
    assert replaced != first_two[0].removeprefix("m/")


@s3_only
def test_a_new_export_removes_the_old_manifest_before_any_file_changes(s3_env, outputs, monkeypatch):
    s3_env.bucket("exp-c")
    cfg = _cfg(outputs, "s3://exp-c/m/")
    export.run(cfg)
    (outputs / "metrics.json").write_text(json.dumps({"after": {"ndcg@10": 0.6}}))  # the next export differs
    _dying_put(monkeypatch, at=2)  # the first file after the marker
    with pytest.raises(export.ExportFailed):
        export.run(cfg)
    assert export.MANIFEST not in s3_env.objects("exp-c", "m/")


@s3_only
def test_a_new_export_removes_what_the_old_one_held_and_this_one_does_not(s3_env, outputs, monkeypatch):
    """Exported with the checkpoint, then without it, killed in between: the prefix ends with exactly the
    new export (a stale checkpoint/ would be read back as part of the model)."""
    s3_env.bucket("exp-d")
    export.run(_cfg(outputs, "s3://exp-d/m/", include=["checkpoint"]))
    assert "checkpoint/state.pt" in s3_env.objects("exp-d", "m/")
    cfg = _cfg(outputs, "s3://exp-d/m/")
    (outputs / "metrics.json").write_text(json.dumps({"after": {"ndcg@10": 0.7}}))  # one file to send again
    import obstore

    real_put = obstore.put
    _dying_put(monkeypatch, at=2)  # on it, after the old manifest is gone: only the journal remembers its files
    with pytest.raises(export.ExportFailed):
        export.run(cfg)
    monkeypatch.setattr(obstore, "put", real_put)
    export.run(cfg)
    remote = s3_env.objects("exp-d", "m/")
    remote.pop(export.MANIFEST)
    assert remote == _local_files(outputs)


@s3_only
@pytest.mark.parametrize(
    "case,setup,message",
    [
        ("no bucket", lambda env: None, "the bucket does not exist"),
        (
            "no credentials",
            lambda env: [env.delenv(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")],
            "--secret-env AWS_ACCESS_KEY_ID=SECRET/KEY and --secret-env AWS_SECRET_ACCESS_KEY=SECRET/KEY",
        ),
    ],
)
def test_preflight_refuses_an_s3_destination_in_one_line(s3_env, outputs, monkeypatch, case, setup, message):
    setup(monkeypatch)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(export.ExportError) as e:
        export.preflight(_cfg(outputs, "s3://never-created/p/"))
    assert message in str(e.value) and "\n" not in str(e.value) and "testing-secret" not in str(e.value)


# ---- the Hub (a stand-in for huggingface_hub's client) --------------------------------------------


@pytest.fixture
def hub(monkeypatch):
    import huggingface_hub.constants as constants

    server = HubStandIn()
    for k, v in server.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)  # read at import: the LFS protocol, as documented
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", server.url)  # also read at import (URLs are parsed against it)
    template = server.url + "/{repo_id}/resolve/{revision}/{filename}"  # hf_hub_download's, read at import too
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    yield server
    server.close()


def test_hub_export_is_one_commit_of_the_output(hub, outputs):
    cfg = _cfg(outputs, "hf://my-org/colbert-tiny", private=True)
    export.preflight(cfg)  # whoami, then the repository is created
    assert hub.repos["my-org/colbert-tiny"].private
    export.run(cfg)
    files = dict(hub.files("my-org/colbert-tiny"))
    manifest = json.loads(files.pop(export.MANIFEST))
    assert files == _local_files(outputs) and set(manifest["files"]) == set(files)
    assert len(hub.repos["my-org/colbert-tiny"].commits) == 1
    assert any(p.endswith(".safetensors") for p in files) and hub.uploads  # the weights went through LFS
    assert hub.validated  # the card's front matter was checked by the Hub before the upload


def test_a_failed_hub_commit_changes_nothing_and_a_retry_sends_no_object_twice(hub, outputs):
    cfg = _cfg(outputs, "hf://my-org/retry")
    export.preflight(cfg)
    hub.fail_commits = 1
    with pytest.raises(export.ExportFailed) as e:
        export.run(cfg)
    assert "HTTP 500" in str(e.value)
    assert hub.files("my-org/retry") == {}  # all or nothing
    sent = list(hub.uploads)
    export.run(cfg)
    assert hub.uploads == sent  # the LFS objects were already held: not sent again
    assert set(hub.files("my-org/retry")) == {*_local_files(outputs), export.MANIFEST}


@pytest.mark.parametrize(
    "token,message",
    [
        (READ_TOKEN, "HF_TOKEN is a read token"),
        ("hf_not_a_token", "the Hub refused HF_TOKEN (HTTP 401"),
        (None, "needs HF_TOKEN"),
    ],
)
def test_preflight_refuses_a_hub_token_that_cannot_write(hub, outputs, monkeypatch, token, message):
    if token is None:
        monkeypatch.delenv("HF_TOKEN")
    else:
        monkeypatch.setenv("HF_TOKEN", token)
    with pytest.raises(export.ExportError) as e:
        export.preflight(_cfg(outputs, "hf://my-org/x"))
    assert message in str(e.value) and "\n" not in str(e.value)
    assert (token or "") not in str(e.value) or token is None
    assert "my-org/x" not in hub.repos


def test_preflight_refuses_a_namespace_the_token_cannot_write(hub, outputs):
    with pytest.raises(export.ExportError) as e:
        export.preflight(_cfg(outputs, "hf://someone-else/x"))
    assert "cannot be created or written (the repository: HTTP 403" in str(e.value)


def test_preflight_refuses_an_existing_repository_of_another_namespace(hub, outputs):
    """A write token passes whoami, and create_repo(exist_ok=True) passes for any repository that exists:
    only a real write (the probe branch) finds that this one is not the token's to write."""
    from tests.helpers.hub import Repo

    hub.repos["someone-else/public"] = Repo(private=False)
    with pytest.raises(export.ExportError) as e:
        export.preflight(_cfg(outputs, "hf://someone-else/public"))
    assert "a probe branch: HTTP 403" in str(e.value)
    assert list(hub.repos["someone-else/public"].branches) == ["main"]


def test_preflight_refuses_private_for_a_public_repository_and_leaves_no_probe(hub, outputs):
    from tests.helpers.hub import Repo

    hub.repos["my-org/open"] = Repo(private=False)
    with pytest.raises(export.ExportError, match="exists and is public, but export.private is set"):
        export.preflight(_cfg(outputs, "hf://my-org/open", private=True))
    export.preflight(_cfg(outputs, "hf://my-org/open"))
    assert list(hub.repos["my-org/open"].branches) == ["main"]  # the probe branch was removed


def test_a_hub_export_removes_an_earlier_exports_files(hub, outputs):
    cfg = _cfg(outputs, "hf://my-org/again")
    export.preflight(cfg)
    export.run(_cfg(outputs, "hf://my-org/again", include=["checkpoint"]))
    assert "checkpoint/state.pt" in hub.files("my-org/again")
    export.run(cfg)
    files = dict(hub.files("my-org/again"))
    files.pop(export.MANIFEST)
    assert files == _local_files(outputs)


FOREIGN = {"LICENSE": b"Apache-2.0\n", "onnx/model.onnx": b"\0onnx" * 100, "eval/beir-results.json": b"{}\n"}


def test_a_hub_export_keeps_the_files_no_export_wrote(hub, outputs):
    """The owner's own files beside an earlier export: only what that export's manifest lists is removed."""
    cfg = _cfg(outputs, "hf://my-org/shared")
    export.preflight(cfg)
    export.run(_cfg(outputs, "hf://my-org/shared", include=["checkpoint"]))
    hub.files("my-org/shared").update(FOREIGN)  # added on the Hub after the first export
    export.preflight(cfg)  # a repository with a manifest passes
    export.run(cfg)
    files = dict(hub.files("my-org/shared"))
    assert {name: files.pop(name) for name in FOREIGN} == FOREIGN
    files.pop(export.MANIFEST)
    assert files == _local_files(outputs)  # the earlier export's checkpoint/state.pt is gone


def test_a_hub_repository_no_export_wrote_is_refused_at_start_unless_replace(hub, outputs):
    from tests.helpers.hub import Repo

    held = {".gitattributes": b"*.onnx filter=lfs diff=lfs merge=lfs -text\n", **FOREIGN}
    hub.repos["my-org/theirs"] = Repo(private=False, branches={"main": dict(held)})
    with pytest.raises(export.ExportError) as e:
        export.preflight(_cfg(outputs, "hf://my-org/theirs"))
    assert str(e.value) == (
        "export.destination hf://my-org/theirs holds 3 file(s) that no colbert-k8s export wrote (LICENSE, "
        "eval/beir-results.json, onnx/model.onnx) and no colbert-k8s-export.json; export to a new or empty "
        "repository, or set export.replace: true to replace its contents"
    )
    with pytest.raises(export.ExportFailed, match="no colbert-k8s export wrote"):  # files that came after the start
        export.run(_cfg(outputs, "hf://my-org/theirs"))
    assert hub.files("my-org/theirs") == held
    cfg = _cfg(outputs, "hf://my-org/theirs", replace=True)
    export.preflight(cfg)
    export.run(cfg)
    files = dict(hub.files("my-org/theirs"))
    assert files.pop(".gitattributes") == held[".gitattributes"] and files.pop(export.MANIFEST)
    assert files == _local_files(outputs)


def test_a_hub_that_stops_answering_is_a_retryable_failure(hub, outputs, monkeypatch):
    from tests.helpers import free_port

    cfg = _cfg(outputs, "hf://my-org/gone")
    export.preflight(cfg)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    with pytest.raises(export.ExportFailed, match="the commit failed"):
        export.run(cfg)
    with pytest.raises(export.ExportFailed, match="the Hub cannot be reached"):
        export.preflight(cfg)


# ---- the card -------------------------------------------------------------------------------------


def test_the_card_parses_and_says_what_the_model_is(tmp_path):
    from huggingface_hub import ModelCard

    from trainer.storage.card import render

    cfg = parse_config(
        {
            **BASE,
            "model": {"name_or_path": "sentence-transformers/all-MiniLM-L6-v2"},
            "data": {"train": {"path": "hf://datasets/org/triplets"}, "eval_beir": str(tmp_path / "nfcorpus")},
            "mine": {"negatives": 1},
            "export": {"destination": "hf://my-org/colbert-nf"},
        }
    )
    metrics = {
        "before": {"ndcg@10": 0.2224, "mrr@10": 0.4},
        "after": {"ndcg@10": 0.3073, "mrr@10": 0.5},
        "index": {"ndcg@10": 0.3001},
        "steps": 48,
        "global_batch": 16,
        "world_size": 2,
        "device": "CPU",
        "precision": "fp32",
        "train_seconds": 906.0,
    }
    text = render(cfg, metrics, "my-org/colbert-nf")
    card = ModelCard(text)
    data = card.data.to_dict()
    assert data["library_name"] == "PyLate" and data["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert {"ColBERT", "PyLate", "sentence-transformers", "colbert-k8s"} <= set(data["tags"])
    assert data["datasets"] == ["org/triplets"]
    results = data["model-index"][0]["results"]
    ndcg = [m for r in results for m in r["metrics"] if m["type"] == "ndcg_at_10"]
    assert ndcg and ndcg[0]["value"] == 0.3073
    assert "| nDCG@10 | 0.2224 | 0.3073 | 0.3001 |" in card.text  # before, after, through the index
    assert 'models.ColBERT(model_name_or_path="my-org/colbert-nf")' in card.text
    assert "1 mined per row by the base model" in card.text and "48 optimizer steps, global batch 16" in card.text
    assert 'revision="dev"' in render(cfg, metrics, "my-org/colbert-nf", "dev")  # the branch it was exported to


def test_the_card_names_a_staged_source_by_its_url(tmp_path):
    from trainer.storage.card import origin

    staged = tmp_path / "cache" / "sources" / "abc"
    (staged / "files").mkdir(parents=True)
    (staged / ".complete").write_text(json.dumps({"url": "s3://models/base/", "files": {}}))
    assert origin(str(staged / "files")) == "s3://models/base/"
    assert origin(str(tmp_path / "elsewhere")) == str(tmp_path / "elsewhere")


def test_the_card_names_a_staged_mining_model_by_its_url(tmp_path):
    from trainer.storage.card import render

    staged = tmp_path / "cache" / "sources" / "abc"
    (staged / "files").mkdir(parents=True)
    (staged / ".complete").write_text(json.dumps({"url": "s3://models/miner/", "files": {}}))
    cfg = parse_config({**BASE, "mine": {"negatives": 1, "model": str(staged / "files")}})  # as staging leaves it
    text = render(cfg, {"steps": 1})
    assert "1 mined per row by `s3://models/miner/`" in text and str(tmp_path) not in text


# ---- a `local` job, killed during the upload ------------------------------------------------------


@s3_only
@pytest.mark.slow
def test_a_local_job_killed_during_the_upload_exports_on_restart_without_training(s3, tmp_path, tiny_model):
    """The done-when of issue 31: a `colbert-k8s local` job exports to S3 (moto) as a pod would; SIGKILLed
    while the weights are on the wire (a proxy holds that PUT), the destination holds no manifest; the
    restart trains no step, sends only what the journal cannot prove is there, and ends byte-identical."""
    import os
    import subprocess

    import psutil
    import yaml

    from tests.helpers import ROOT, write_triplets
    from tests.helpers.stores import StallingProxy

    s3.bucket("e2e-export")
    proxy = StallingProxy(s3.url, stall="/tiny/model.safetensors")  # the main weights, after 1_Dense/ and others
    (tmp_path / "data").mkdir()
    write_triplets(tmp_path / "data" / "train.jsonl", 24)
    cfg = {
        "model": {"name_or_path": str(tiny_model), "query_length": 16, "document_length": 48},
        "data": {"train": {"path": "data/train.jsonl"}},
        "training": {"per_device_batch_size": 4, "max_steps": 3, "log_every": 1},
        "checkpoint": {"every_steps": 2},
        "evaluation": {"after_training": False},
        "export": {"destination": "s3://e2e-export/tiny/"},
        "output_dir": "output",
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(cfg))
    flags = ("--nodes", "2", "--pvc-size", "1Gi", *s3_flags(proxy.url))  # a claim: the resubmitted job finds it all
    cmd = local_command(tmp_path / "train.yaml", "exp", tmp_path, *flags)
    env = {**os.environ, **s3.env}
    try:
        log = open(tmp_path / "first.log", "w")
        first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        assert proxy.stalled.wait(300), (tmp_path / "first.log").read_text()[-3000:]
        children = psutil.Process(first.pid).children(recursive=True)
        first.kill()  # `local` alone: its replicas die with it
        first.wait(30)
        psutil.wait_procs(children, timeout=60)
        text = (tmp_path / "first.log").read_text()
        assert "step 3/3" in text
        remote = s3.objects("e2e-export", "tiny/")
        assert remote and export.MANIFEST not in remote and "model.safetensors" not in remote  # no half export

        proxy.stall = None
        again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    finally:
        proxy.close()
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-3000:]
    assert "the job: done before" in out and "step 1/3" not in out, out[-5000:]  # no training step
    assert "export: s3://e2e-export/tiny/ (" in again.stdout  # local's summary names where the model went
    assert "testing-secret" not in text + out
    output = tmp_path / "output"
    remote = s3.objects("e2e-export", "tiny/")
    manifest = json.loads(remote.pop(export.MANIFEST))
    assert remote == _local_files(output) and set(manifest["files"]) == set(remote)
    result = json.loads((output / "export.json").read_text())
    assert 0 < result["bytes_sent"] < result["bytes"]  # what the first start sent was not sent again
    card = (output / "final-model" / "README.md").read_text()
    assert "library_name: PyLate" in card and "3 optimizer steps" in card


@s3_only
@pytest.mark.parametrize(
    "case,bucket,drop,message",
    [
        ("no bucket", "never-made", (), "the bucket does not exist"),
        ("no credentials", "made", ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"), "--secret-env AWS_ACCESS_KEY_ID="),
    ],
)
def test_the_trainer_refuses_a_bad_destination_before_loading_anything(
    s3, tmp_path, tiny_model, case, bucket, drop, message
):
    """`colbert-train` in a pod: a destination it cannot write is one line and exit 2, before staging, the
    model, or a step (torch is not even imported: trainer/cli.py checks before)."""
    import os
    import subprocess
    import sys

    import yaml

    from tests.helpers import ROOT

    s3.bucket("made")
    (tmp_path / "train.yaml").write_text(
        yaml.safe_dump(
            {
                "model": {"name_or_path": str(tiny_model)},
                "data": {"train": {"path": str(tmp_path / "absent.jsonl")}},
                "training": {"max_steps": 1},
                "output_dir": str(tmp_path / "out"),
                "export": {"destination": f"s3://{bucket}/runs/x/"},
            }
        )
    )
    env = {k: v for k, v in {**os.environ, **s3.env, "AWS_EC2_METADATA_DISABLED": "true"}.items() if k not in drop}
    res = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", str(tmp_path / "train.yaml")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr[-2000:]
    errors = [line for line in res.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in res.stderr
    assert "absent.jsonl" not in res.stderr  # found before the data is even looked at
    assert not (tmp_path / "out").exists()


@s3_only
def test_an_export_reads_back_as_a_model_and_a_half_or_mixed_one_is_refused(s3_env, outputs, tmp_path):
    """`model.name_or_path: s3://.../` of an export stages exactly its manifest's files, checked; a prefix
    with the export's in-progress marker, or a file that is not the manifest's, is refused in one line."""
    from trainer.storage.sources import SourceError, stage

    s3_env.bucket("exp-e")
    export.run(_cfg(outputs, "s3://exp-e/m/"))
    s3_env.put("exp-e", "m/notes-left-by-someone.txt", b"not part of the export")
    staged = stage("s3://exp-e/m/", tmp_path / "cache")
    files = {p.relative_to(staged).as_posix(): p.read_bytes() for p in staged.rglob("*") if p.is_file()}
    assert files == _local_files(outputs)  # the stray object is not read with the model
    s3_env.put("exp-e", "m/config.json", b"{}")
    with pytest.raises(SourceError, match="does not match the export's manifest"):
        stage("s3://exp-e/m/", tmp_path / "cache2")
    s3_env.put("exp-e", "m/" + export.PARTIAL, b"")
    with pytest.raises(SourceError, match="an export is being written there"):
        stage("s3://exp-e/m/", tmp_path / "cache3")
