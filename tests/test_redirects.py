"""No credential follows a redirect (trainer/redirects.py): every client of the project that sends a token, key or
password meets an endpoint that answers 302 or 307 with a ``Location`` on another server (another port on
127.0.0.1: another origin), which records the headers it receives (tests/helpers/redirects.py). That server never
sees the credential, and the user gets one line naming the redirect and the fix."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.helpers.redirects import Elsewhere, Redirector

SECRET = "s3cr3t-never-elsewhere"  # every credential below contains it


@dataclass(frozen=True)
class Case:
    """One client: ``run(endpoint, monkeypatch, tmp_path)`` drives it against ``endpoint`` and returns the line
    the user sees; ``fix`` is a piece of that line's fix; ``scheme``: the ``Location``'s (an exec's is ws://)."""

    name: str
    run: Callable[[str, pytest.MonkeyPatch, Path], str]
    fix: str
    scheme: str = "http"
    tls: bool = False


# ---- the Model Registry (urllib, the shared no-redirect opener) --------------------------------------------


def _registry_find(url: str, mp, tmp: Path) -> str:
    from trainer.serve.register import Entry, register
    from trainer.serve.registry import Registry, RegistryError

    with pytest.raises(RegistryError) as e:
        register(Registry(url, f"Bearer-{SECRET}"), Entry("m", "v1", "s3://b/run/", "0" * 64))
    return str(e.value)


def _registry_create(url: str, mp, tmp: Path) -> str:  # a POST: urllib would turn a followed 302 into a GET
    from trainer.serve.registry import Registry, RegistryError

    with pytest.raises(RegistryError) as e:
        Registry(url, SECRET).create_model({"name": "m"})
    return str(e.value)


def _register_command(url: str, mp, tmp: Path) -> str:
    from click.testing import CliRunner

    from operator_cli.cli import cli
    from trainer.storage.export import MANIFEST

    root = tmp / "export"
    root.mkdir()
    (root / "README.md").write_text("# run-1\n\nfine-tuned from `org/base`\n")
    (root / "metrics.json").write_text("{}")
    digest = hashlib.sha256(b"{}").hexdigest()
    (root / MANIFEST).write_text(json.dumps({"files": {"metrics.json": {"sha256": digest}}}))
    args = ["register", str(root), "--model", "m", "--registry-url", url]
    res = CliRunner().invoke(cli, args, env={"MODEL_REGISTRY_TOKEN": SECRET})
    assert res.exit_code != 0 and "Traceback" not in res.output, res.output
    error, hint = res.output.strip().splitlines()  # the error line, then the hint
    return error


# ---- the TrainJob's progress (urllib, the same opener; the token only over https) ----------------------------


def _progress(url: str, mp, tmp: Path) -> str:
    from trainer.reporting.progress import Progress

    (tmp / "token").write_text(SECRET)
    env = {
        "KUBEFLOW_TRAINER_SERVER_URL": url + "/status",
        "KUBEFLOW_TRAINER_SERVER_CA_CERT": str(tmp / "ca.crt"),
        "KUBEFLOW_TRAINER_SERVER_TOKEN": str(tmp / "token"),
    }
    logger, records = logging.getLogger("trainer"), []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    try:
        progress = Progress(total_steps=2, env=env, interval=0.0, timeout=5.0)
        progress._post({"trainerStatus": {"progressPercentage": 1}})  # the one request the poster makes
        progress.close()
    finally:
        logger.removeHandler(handler)
    (line,) = [r.getMessage() for r in records if "could not report progress" in r.getMessage()]
    return line


# ---- the Kubernetes API (urllib3) and an exec's websocket (websocket-client) ----------------------------------


def _cluster(url: str, tmp: Path):
    from operator_cli.kube.cluster import Cluster
    from operator_cli.kube.transport import connect

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": SECRET}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "ns"}}],
    }
    (tmp / "kubeconfig").write_text(yaml.safe_dump(config))
    return Cluster(connect(str(tmp / "kubeconfig"), timeout=10), "ns")


def _kube_request(url: str, mp, tmp: Path) -> str:
    from operator_cli.errors import CliError

    with pytest.raises(CliError) as e:
        _cluster(url, tmp).pod("trainer-0")
    return e.value.message


def _kube_exec(url: str, mp, tmp: Path) -> str:
    from operator_cli.errors import CliError
    from operator_cli.kube.fetch import exec_stream

    with pytest.raises(CliError) as e:
        exec_stream(_cluster(url, tmp), "fetch-pod", ["tar", "-c", "."])
    return e.value.message


# ---- the Hugging Face Hub (huggingface_hub over httpx, guarded) --------------------------------------------


def _hub_env(url: str, mp) -> None:
    import huggingface_hub.constants as constants

    mp.setenv("HF_ENDPOINT", url)
    mp.setenv("HF_TOKEN", f"hf_{SECRET}")
    mp.setattr(constants, "HF_HUB_OFFLINE", False)
    mp.setattr(constants, "HF_HUB_DISABLE_XET", True)
    mp.setattr(constants, "ENDPOINT", url)
    mp.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")


def _hub_export(url: str, mp, tmp: Path) -> str:
    from trainer.config.base import parse_destination
    from trainer.destinations.base import ExportError
    from trainer.destinations.hub import HubRepository

    _hub_env(url, mp)
    cfg = SimpleNamespace(export=SimpleNamespace(private=False, revision=None, replace=False))
    with pytest.raises(ExportError) as e:
        HubRepository().preflight(cfg, parse_destination("hf://alice/colbert"), None)
    return str(e.value)


def _hub_download(url: str, mp, tmp: Path) -> str:
    """huggingface_hub's file resolver follows a redirect to the same host name itself, any port, with the header."""
    from trainer.destinations.hub import _REDIRECT_FIX, _hub
    from trainer.redirects import hub_redirect

    _hub_env(url, mp)
    with pytest.raises(Exception) as e:
        _hub(None).hf_hub_download("alice/colbert", "colbert-k8s-export.json", cache_dir=str(tmp / "cache"))
    return hub_redirect(e.value, _REDIRECT_FIX) or str(e.value)


# ---- object stores (obstore over reqwest; a custom endpoint is probed) -------------------------------------------


def _s3_env(url: str, mp) -> None:
    mp.setenv("AWS_ENDPOINT_URL", url)
    mp.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    mp.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    mp.setenv("AWS_SESSION_TOKEN", f"session-{SECRET}")
    mp.setenv("AWS_REGION", "us-east-1")


def _s3_export(url: str, mp, tmp: Path) -> str:
    from trainer.config.base import parse_destination
    from trainer.destinations.base import ExportError
    from trainer.destinations.store import ObjectStore

    _s3_env(url, mp)
    with pytest.raises(ExportError) as e:
        ObjectStore().preflight(None, parse_destination("s3://models/run-1/"), None)
    return str(e.value)


def _s3_source(url: str, mp, tmp: Path) -> str:
    from trainer.storage.sources import SourceError, stage

    _s3_env(url, mp)
    with pytest.raises(SourceError) as e:
        stage("s3://data/train.jsonl", tmp / "cache")
    return str(e.value)


def _s3_register(url: str, mp, tmp: Path) -> str:
    from trainer.serve.register import read_export
    from trainer.serve.registry import RegistryError

    _s3_env(url, mp)
    with pytest.raises(RegistryError) as e:
        read_export("s3://models/run-1/")
    return str(e.value)


def _azure_register(url: str, mp, tmp: Path) -> str:
    from trainer.serve.register import read_export
    from trainer.serve.registry import RegistryError

    mp.setenv("AZURE_STORAGE_USE_EMULATOR", "true")  # the emulator's well-known key signs every request
    mp.setenv("AZURITE_BLOB_STORAGE_URL", url)
    with pytest.raises(RegistryError) as e:
        read_export("az://models/run-1/")
    return str(e.value)


CASES = [
    Case("registry-find", _registry_find, "set register.url / MODEL_REGISTRY_URL to the registry's own address"),
    Case("registry-create", _registry_create, "set register.url / MODEL_REGISTRY_URL to the registry's own address"),
    Case("register-command", _register_command, "set register.url to the registry's own address"),
    Case("progress", _progress, "the status URL the Trainer injects must be the endpoint itself", tls=True),
    Case("kube-request", _kube_request, "point the kubeconfig's server: at the API server itself"),
    Case("kube-exec", _kube_exec, "point the kubeconfig's server: at the API server itself", scheme="ws"),
    Case("hub-export", _hub_export, "set HF_ENDPOINT to the Hub's own address"),
    Case("hub-download", _hub_download, "set HF_ENDPOINT to the Hub's own address"),
    Case("s3-export", _s3_export, "set AWS_ENDPOINT_URL to the store's own address"),
    Case("s3-source", _s3_source, "set AWS_ENDPOINT_URL to the store's own address"),
    Case("s3-register", _s3_register, "set AWS_ENDPOINT_URL to the store's own address"),
    Case("azure-register", _azure_register, "set AZURITE_BLOB_STORAGE_URL to the store's own address"),
]


@pytest.fixture(scope="module")
def cert():
    """A CA and a certificate for "localhost": the progress poster sends its token over https only."""
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    return ca, ca.issue_cert("localhost")


@pytest.mark.parametrize("status", [302, 307])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_no_credential_follows_a_redirect(case: Case, status: int, cert, monkeypatch, tmp_path):
    elsewhere = Elsewhere()
    ca, leaf = cert
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    endpoint = Redirector(status, elsewhere.url.replace("http", case.scheme, 1), leaf if case.tls else None)
    try:
        line = case.run(endpoint.url, monkeypatch, tmp_path)
    finally:
        endpoint.close()
        elsewhere.close()
    assert endpoint.seen, "the client never reached the endpoint it was given"
    leaked = [
        seen for seen in elsewhere.credentials() if "authorization" in seen or any(SECRET in v for v in seen.values())
    ]
    assert leaked == [], f"{case.name}: a credential reached the redirect's host"
    where = elsewhere.url.split("://")[1]
    assert "\n" not in line and SECRET not in line, line
    assert "a redirect to" in line and where in line and case.fix in line, line
    if "followed without the token" not in line:  # the Hub's downloads must follow, without the token
        assert f"HTTP {status}" in line and "not followed" in line, line


@pytest.mark.parametrize("status", [302, 307])
def test_obstore_strips_authorization_but_not_s3s_session_token(status, monkeypatch):
    """Why :func:`trainer.redirects.probe_endpoint` exists: reqwest, under obstore, follows a GET's redirect to
    another port without ``Authorization`` (the signature) but with ``x-amz-security-token``. If this fails on its
    second assertion, obstore stopped sending the session token elsewhere and the probe may go."""
    import obstore
    from obstore.store import from_url

    elsewhere = Elsewhere()
    endpoint = Redirector(status, elsewhere.url)
    _s3_env(endpoint.url, monkeypatch)
    store = from_url("s3://data", endpoint=endpoint.url, client_options={"allow_http": True, "timeout": "10s"})
    try:
        with pytest.raises(Exception):  # noqa: B017 (Elsewhere's 401, in obstore's words)
            obstore.get(store, "train.jsonl").bytes()
    finally:
        endpoint.close()
        elsewhere.close()
    (seen,) = elsewhere.credentials()
    assert "authorization" not in seen
    assert seen.get("x-amz-security-token") == f"session-{SECRET}"
