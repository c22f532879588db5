"""The bad-input table: flags, configs, environment and server behaviour.

Every case asserts: a non-zero exit, exactly one ``error:`` line, no traceback, the offending flag
or key named, and no secret value echoed. Server cases run against fake API servers on 127.0.0.1
(one that accepts and never answers, one that answers HTML, one with a chosen status) and also
assert how many requests reached the server (none, for a name the CLI must refuse).
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from operator_cli.cli import cli
from tests.helpers import free_port

SECRET = "hf_SeCrEtVaLuE1234567890"
GOOD_CONFIG = "data:\n  train: {path: data/train.jsonl}\n"


def _invoke(args: list[str], env: dict | None = None):
    return CliRunner().invoke(cli, args, env=env, catch_exceptions=False)


def _assert_one_line(res, needle: str, code: int | None = None) -> None:
    out = res.output
    assert res.exit_code != 0, out
    if code is not None:
        assert res.exit_code == code, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out
    assert needle in errors[0], out
    assert "Traceback" not in out
    assert SECRET not in out and "s3cr3t-pass" not in out


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "train.yaml"
    path.write_text(GOOD_CONFIG)
    return path


# ---- flags -----------------------------------------------------------------------------------------

FLAG_CASES = [
    ("empty-name", ["--name", ""], "--name"),
    ("dot-name", ["--name", "."], "--name"),
    ("upper-name", ["--name", "Job"], "--name"),
    ("newline-name", ["--name", "job\n"], "--name"),
    ("dash-name", ["--name", "-job"], "--name"),
    ("long-name", ["--name", "a" * 64], "--name"),
    ("upper-namespace", ["-n", "Default"], "--namespace"),
    ("newline-namespace", ["-n", "ns\n"], "--namespace"),
    ("dotted-namespace", ["-n", "a.b"], "--namespace"),
    ("newline-memory", ["--memory", "64Gi\n"], "--memory"),
    ("word-memory", ["--memory", "lots"], "--memory"),
    ("zero-memory", ["--memory", "0Gi"], "--memory"),
    ("negative-cpu", ["--cpu", "-1"], "--cpu"),
    ("zero-unit-shm", ["--shm-size", "0Gi"], "--shm-size"),
    ("upper-pvc", ["--pvc", "Data"], "--pvc"),
    ("env-without-key", ["--env", f"={SECRET}"], "--env"),
    ("env-without-equals", ["--env", SECRET], "--env"),
    ("env-token", ["--env", f"HF_TOKEN={SECRET}"], "--env HF_TOKEN holds"),
    ("env-pat", ["--env", f"GITHUB_PAT={SECRET}"], "GITHUB_PAT"),
    ("env-database-url", ["--env", f"DATABASE_URL=postgres://u:{SECRET}@db/x"], "DATABASE_URL"),
    ("env-private-key", ["--env", f"SSH_PRIVATE_KEY={SECRET}"], "SSH_PRIVATE_KEY"),
    ("env-webhook", ["--env", f"SLACK_WEBHOOK_URL={SECRET}"], "SLACK_WEBHOOK_URL"),
    ("env-passphrase", ["--env", f"GPG_PASSPHRASE={SECRET}"], "GPG_PASSPHRASE"),
    ("env-reserved", ["--env", "MASTER_ADDR=x"], "MASTER_ADDR"),
    ("env-reserved-pet", ["--env", "PET_NNODES=3"], "PET_NNODES"),
    ("env-duplicate", ["--env", "A=1", "--env", "A=2"], "--env"),
    ("env-control-char", ["--env", "A=x\x7fy"], "control characters"),
    ("secret-env-pasted-value", ["--secret-env", SECRET], "--secret-env"),
    ("secret-env-reserved", ["--secret-env", "RANK=s/k"], "RANK"),
    ("secret-env-bad-secret", ["--secret-env", "X=Bad_Secret/k"], "must name a Secret"),
    ("label-key-injection", ["--label", "a: b\nkind: Secret=x"], "--label key"),
    ("label-value-newline", ["--label", "k=v\n"], "--label value"),
    ("annotation-key-1100", ["--annotation", "k" * 1100 + "=v"], "--annotation key"),
    ("annotation-c1-value", ["--annotation", "example.com/n=a\x85b"], "--annotation"),
    ("toleration-effect", ["--toleration", "k:Sometimes"], "--toleration"),
    ("image-newline", ["--image", "reg/img:tag\n"], "--image"),
    ("node-selector-space", ["--node-selector", "a b=c"], "--node-selector"),
    ("multi-node-no-storage", ["--nodes", "2"], "--nodes 2 without shared storage"),
    ("zero-nodes", ["--nodes", "0"], "--nodes"),
    ("too-many-gpus", ["--gpus-per-node", "17"], "--gpus-per-node"),
    ("duplicate-nodes", ["--nodes", "2", "--nodes", "3"], "--nodes is given twice"),
    ("negative-backoff", ["--backoff-limit", "-1"], "--backoff-limit"),
    ("negative-grace", ["--termination-grace-period", "-5"], "--termination-grace-period"),
    ("nccl-on-cpu", ["--nccl", "socket", "--gpus-per-node", "0"], "--nccl"),
    # issue 21's leftovers
    ("label-overrides-managed-by", ["--label", "app.kubernetes.io/managed-by=me"], "set by colbert-k8s itself"),
    ("env-duplicates-nccl-preset", ["--nccl", "socket", "--env", "NCCL_DEBUG=INFO"], "also set by --nccl socket"),
    ("secret-env-twice", ["--secret-env", "A=s/k", "--secret-env", "A=t/k"], "--secret-env A is given twice"),
    ("env-and-secret-env", ["--env", "A=1", "--secret-env", "A=s/k"], "both --env and --secret-env"),
    ("backoff-past-int32", ["--backoff-limit", "3000000000"], "--backoff-limit must be between 0 and 2147483647"),
    ("deadline-past-int64", ["--active-deadline", "1" + "0" * 20], "--active-deadline must be between"),
    ("empty-namespace", ["-n", ""], "--namespace"),
    # a secret value pasted where the Secret's name or key belongs is described, never echoed
    ("secret-value-as-ref", ["--secret-env", f"AWS_SECRET_ACCESS_KEY={SECRET}/abc+def"], "not shown"),
    ("secret-value-as-key", ["--secret-env", f"HF_TOKEN=hf/{SECRET}/x"], "not shown"),
    # a credential value is refused whatever flag it came through, under whatever name (trainer/config/credentials.py)
    ("label-token-value", ["--label", f"team={SECRET}"], "--label team holds a Hugging Face token"),
    ("annotation-token-value", ["--annotation", f"example.com/note={SECRET}"], "--annotation example.com/note holds"),
    ("env-plain-name-token-value", ["--env", f"MODEL_REVISION={SECRET}"], "--env MODEL_REVISION holds"),
    (
        "env-url-with-password",
        ["--env", "MLFLOW_TRACKING_URI=https://u:s3cr3t-pass@mlflow/x"],
        "--env MLFLOW_TRACKING_URI holds a URL",
    ),
    ("node-selector-token-value", ["--node-selector", f"pool={SECRET}"], "--node-selector pool holds"),
    ("env-two-line-name-token-value", ["--env", f"A\nB={SECRET}"], "--env holds"),  # the name is not echoed
    ("image-with-userinfo", ["--image", "u:s3cr3t-pass@reg/img:1"], "--image"),
    ("env-sas-token", ["--env", "AZURE_SAS=sv=2022-11-02&sp=r&sig=s3cr3t-pass"], "--env AZURE_SAS holds a signed"),
    # click's own usage errors come in the same two lines
    ("unknown-flag", ["--gpu", "1"], "No such option '--gpu'"),
    ("flag-not-an-integer", ["--gpus-per-node", "x"], "'--gpus-per-node'"),
]


@pytest.mark.parametrize("name,flags,needle", FLAG_CASES, ids=[c[0] for c in FLAG_CASES])
def test_bad_flag(name, flags, needle, config):
    res = _invoke(["render", "--config", str(config), *flags])
    _assert_one_line(res, needle)
    assert "Usage:" not in res.output and len(res.output.splitlines()) <= 2, res.output  # error + hint


def test_a_command_without_its_argument_is_two_lines():
    res = CliRunner().invoke(cli, ["logs"], prog_name="colbert-k8s")
    assert res.output.splitlines() == ["error: Missing argument 'NAME'.", "hint: see `colbert-k8s logs --help`"]
    assert res.exit_code == 2


def test_a_quantity_with_an_exponent_is_valid(config):
    """1e10 is a Kubernetes quantity (a decimal exponent): accepted and passed on as written (above the default
    8Gi /dev/shm, which counts against it)."""
    res = _invoke(["render", "--config", str(config), "--memory", "1e10"])
    assert res.exit_code == 0, res.output
    assert "memory: 1e10" in res.output


def test_allowed_lookalikes_are_not_refused(config):
    """The credential rule must not refuse harmless names that contain TOKEN."""
    res = _invoke(["render", "--config", str(config), "--env", "TOKENIZERS_PARALLELISM=false", "--env", "A=x\ty"])
    assert res.exit_code == 0, res.output
    assert "TOKENIZERS_PARALLELISM" in res.output
    digest = "reg.io:5000/team/img:1.0@sha256:" + "0a" * 32
    lookalikes = ["--image", digest, "--env", "JOB=task-abcdefghijklmnopqrstuvwxyz", "--annotation", "x.io/a=hf_team"]
    res = _invoke(["render", "--config", str(config), *lookalikes])
    assert res.exit_code == 0, res.output
    assert digest in res.output and "task-abcdefghijklmnopqrstuvwxyz" in res.output


def test_output_dir_under_a_file(config, tmp_path):
    (tmp_path / "file").write_text("x")
    _assert_one_line(_invoke(["render", "--config", str(config), "-d", str(tmp_path / "file" / "out")]), "-d")
    assert (tmp_path / "file").read_text() == "x"  # nothing already written is touched


def test_local_workdir_that_cannot_be_written(config, tmp_path):
    """It was an 'internal error' (NotADirectoryError) once the replicas' directories were made."""
    (tmp_path / "file").write_text("x")
    res = _invoke(["local", "--config", str(config), "--gpus-per-node", "0", "--workdir", str(tmp_path / "file" / "w")])
    _assert_one_line(res, "--workdir")
    assert res.exit_code == 2 and (tmp_path / "file").read_text() == "x"


def test_a_workdir_another_replay_holds_is_refused_and_left_alone(config, tmp_path):
    """Two replays in one --workdir trained into the same output_dir at once, interleaving checkpoints."""
    from filelock import FileLock

    workdir = tmp_path / "w"
    workdir.mkdir()
    with FileLock(workdir / ".colbert-k8s-local.lock"):  # what a running `local` holds
        res = _invoke(["local", "--config", str(config), "--gpus-per-node", "0", "--workdir", str(workdir)])
    _assert_one_line(res, "is in use by another `colbert-k8s local` replay")
    assert res.exit_code == 2
    assert sorted(p.name for p in workdir.iterdir()) == [".colbert-k8s-local.lock"]  # no pod directory made


def test_a_pod_directory_local_did_not_make_is_left_alone(config, tmp_path):
    """It was click's own "Error:" with exit code 1, unlike every other line of this tool."""
    theirs = tmp_path / "w" / "pods" / "demo-master-0"
    theirs.mkdir(parents=True)
    (theirs / "notes.txt").write_text("mine")
    res = _invoke(
        ["local", "--config", str(config), "--name", "demo", "--gpus-per-node", "0", "--workdir", str(tmp_path / "w")]
    )
    _assert_one_line(res, "exists and was not made by `colbert-k8s local`", code=2)
    assert [p.name for p in theirs.iterdir()] == ["notes.txt"] and (theirs / "notes.txt").read_text() == "mine"


def test_timeout_without_wait(config):
    _assert_one_line(_invoke(["submit", "--config", str(config), "--timeout", "5"]), "--timeout")


# ---- configs ---------------------------------------------------------------------------------------

BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)}]\n" for i in range(8)
)

CONFIG_CASES = [
    ("alias-bomb", BOMB.encode(), "aliases"),
    ("latin-1", "data:\n  train: {path: caf\xe9.jsonl}\n".encode("latin-1"), "not UTF-8"),
    ("utf-16", GOOD_CONFIG.encode("utf-16"), "not UTF-8"),
    ("huge-int", b"training: {max_steps: " + b"9" * 5000 + b"}\n", "digits"),
    ("deep-nesting", b"a: " + b"[" * 1000 + b"]" * 1000 + b"\n", "nested deeper"),
    ("duplicate-key", (GOOD_CONFIG + "data: {}\n").encode(), "appears twice"),
    ("unknown-key", (GOOD_CONFIG + "trainng: {}\n").encode(), "trainng"),
    ("wrong-type", (GOOD_CONFIG + "training: {max_steps: many}\n").encode(), "training.max_steps"),
    ("out-of-range", (GOOD_CONFIG + "training: {learning_rate: 2}\n").encode(), "training.learning_rate"),
    ("too-large", b"# " + b"x" * (1 << 20) + b"\n" + GOOD_CONFIG.encode(), "too large"),
    ("top-level-list", b"- a\n- b\n", "mapping"),
    ("empty-file", b"", "mapping"),
    ("bad-syntax", b"data: [unclosed\n", "not valid YAML"),
    ("secret-in-config", (GOOD_CONFIG + f"hf_token: {SECRET}\n").encode(), "hf_token"),
    # issue 21's leftovers: YAML's true is not a batch size of 1, .inf is not a number of epochs
    ("bool-for-int", (GOOD_CONFIG + "training: {per_device_batch_size: true}\n").encode(), "per_device_batch_size"),
    ("infinite-epochs", (GOOD_CONFIG + "training: {epochs: .inf}\n").encode(), "training.epochs"),
    ("nel-in-config", "data:\n  train: {path: data/tr\x85ain.jsonl}\n".encode(), "U+0085"),
    ("mine-range-past-top-k", (GOOD_CONFIG + "mine: {top_k: 10, rank_range: [3, 30]}\n").encode(), "mine.top_k"),
    (
        "a-removed-key",
        (GOOD_CONFIG + "training: {negatives_per_row: 1}\n").encode(),
        "'training.negatives_per_row' was removed in 0.4.0; delete the key",
    ),
    ("a-removed-mine-key", (GOOD_CONFIG + "mine: {round_start: base}\n").encode(), "'mine.round_start' was removed"),
    (
        "a-removed-loss-key",  # inside the loss union: named without its tag
        (GOOD_CONFIG + "loss: {name: contrastive, mask_labelled_positives: true}\n").encode(),
        "'loss.mask_labelled_positives' was removed in 0.5.0; delete the key",
    ),
    # the config becomes a ConfigMap: no credential in any value or key, whatever its name
    (
        "url-with-password",
        (GOOD_CONFIG + "model: {name_or_path: 'https://u:s3cr3t-pass@h/m'}\n").encode(),
        "'model.name_or_path' holds a URL with user:password@",
    ),
    ("token-in-any-value", (GOOD_CONFIG + f"tracking: {{run_name: {SECRET}}}\n").encode(), "'tracking.run_name'"),
    ("token-in-a-list", (GOOD_CONFIG + f"mine: {{rank_range: [1, {SECRET}]}}\n").encode(), "'mine.rank_range[1]'"),
    ("token-as-a-key", (GOOD_CONFIG + f"{SECRET}: 1\n").encode(), "a key under 'the top level'"),
    # a source URL the trainer could not fetch is refused by render, not by the pod at start
    ("url-unknown-scheme", b"data:\n  train: {path: 'ftp://h/t.jsonl'}\n", "ftp:// is not a source"),
    ("url-without-bucket", b"data:\n  train: {path: 's3:///t.jsonl'}\n", "s3:// names no bucket"),
    ("url-without-host", b"data:\n  train: {path: 'https://'}\n", "https:// names no host"),
    ("url-bad-ipv6", GOOD_CONFIG.encode() + b"model: {name_or_path: 'https://[::1/m'}\n", "Invalid IPv6 URL"),
    ("url-bad-ipv4", b"data: {train: {path: t.jsonl}, eval_beir: 'http://999.1.1.1/b/'}\n", "not an IPv4"),
    ("url-bad-port", GOOD_CONFIG.encode() + b"mine: {corpus: 'https://h:http/c.jsonl'}\n", "'mine.corpus'"),
    ("hf-without-name", GOOD_CONFIG.encode() + b"mine: {model: 'hf://'}\n", "hf:// names no repository"),
    # a signed URL: its signature is a credential; any other query the stager would drop (issue 42)
    (
        "url-azure-sas",
        b"data: {train: {path: 'https://a.blob.core.windows.net/c/t.jsonl?sv=1&sp=r&sig=s3cr3t-pass'}}\n",
        "'data.train.path' holds a signed URL's signature (sig=, X-Goog-Signature=",
    ),
    (
        "url-gcs-signed",
        GOOD_CONFIG.encode() + b"model: {name_or_path: 'https://storage.googleapis.com/b/m/?X-Goog-"
        b"Algorithm=GOOG4-RSA-SHA256&X-Goog-Signature=s3cr3t-pass'}\n",
        "'model.name_or_path' holds a signed URL's",
    ),
    (
        "url-query",
        b"data: {train: {path: 'https://h.example/t.jsonl?versionId=s3cr3t-pass'}}\n",
        "'data.train.path': has a query string or fragment, which the stager cannot use",
    ),
]


@pytest.mark.parametrize("name,content,needle", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_bad_config(name, content, needle, tmp_path):
    path = tmp_path / "train.yaml"
    path.write_bytes(content)
    started = time.monotonic()
    res = _invoke(["render", "--config", str(path)])
    _assert_one_line(res, needle)
    assert time.monotonic() - started < 30  # bounded work, not a hang (generous: a slow CI box)


def test_a_rule_across_sections_names_the_rule_not_the_whole_config(tmp_path):
    """A rule of the whole config or of a section echoed every key of it after the message ("(got {...})")."""
    path = tmp_path / "train.yaml"
    path.write_text(GOOD_CONFIG + "evaluation: {before_training: true}\ntracking: {run_name: " + "r" * 400 + "}\n")
    res = _invoke(["render", "--config", str(path)])
    _assert_one_line(res, "evaluation.before_training needs data.eval_beir")
    assert "{" not in res.output and "rrrr" not in res.output
    path.write_text(GOOD_CONFIG + "training: {seed: " + "9x" * 400 + "}\n")
    res = _invoke(["render", "--config", str(path)])
    _assert_one_line(res, "'training.seed': Input should be a valid integer (got '9x9x")
    assert res.output.count("9x") < 70 and "...)" in res.output  # the value is clipped


def test_missing_config_file(tmp_path):
    _assert_one_line(_invoke(["render", "--config", str(tmp_path / "nope.yaml")]), "config file not found")


LONG_PATH = "a" * 5000
LONG_PATHS = [
    ("render-config", ["render", "--config", LONG_PATH], {}, "--config: File name too long"),
    ("submit-config", ["submit", "--config", LONG_PATH, "--dry-run=client"], {}, "--config: File name too long"),
    ("tune-config", ["tune", "--config", LONG_PATH, "--param", "mine.negatives=choice(1,3)"], {}, "--config: File"),
    ("kubeconfig-env", ["list"], {"KUBECONFIG": LONG_PATH}, "$KUBECONFIG: File name too long"),
    ("kubeconfig-env-second", ["status", "demo"], {"KUBECONFIG": f"/nowhere:{LONG_PATH}"}, "$KUBECONFIG: File name"),
    ("kubeconfig-flag", ["list", "--kubeconfig", LONG_PATH], {}, "--kubeconfig: File name too long"),
    ("argument", ["upload", "--pvc", "data", LONG_PATH], {}, "a path argument: File name too long"),
]


@pytest.mark.parametrize("args,env,needle", [c[1:] for c in LONG_PATHS], ids=[c[0] for c in LONG_PATHS])
def test_a_path_the_system_refuses_is_one_line_naming_where_it_came_from(args, env, needle):
    """A path the kernel refuses (ENAMETOOLONG here), in any command's option or argument or in $KUBECONFIG:
    one line naming it and the reason, exit 2, never an internal error."""
    res = _invoke(args, env={"KUBECONFIG": "", **env})
    _assert_one_line(res, needle, code=2)
    assert "internal error" not in res.output and LONG_PATH not in res.output
    assert "a 5000-character value (not shown)" in res.output and "shorter path" in res.output


# ---- environment -----------------------------------------------------------------------------------


def test_broken_kubeconfig_env(tmp_path):
    bad = tmp_path / "kubeconfig"
    bad.write_text("apiVersion: v1\nclusters: 7\n")
    res = _invoke(["list"], env={"KUBECONFIG": str(bad)})
    _assert_one_line(res, "kubeconfig")


def test_a_kubeconfig_server_that_is_not_a_url(tmp_path):
    """urllib3 would warn about it with a source line, then fail to resolve it: one line instead."""
    res = _invoke(["list", "--kubeconfig", str(_kubeconfig(tmp_path, "ht!tp://::::"))])
    _assert_one_line(res, "is not an http(s):// URL")
    assert "Warning" not in res.output


def test_a_list_of_null_items_is_an_empty_list_in_the_contexts_namespace(tmp_path, fake_api):
    server = fake_api("null-items")
    res = _invoke(["list", "--kubeconfig", str(_kubeconfig(tmp_path, server.url))])
    assert res.exit_code == 0, res.output
    assert res.output == "no colbert-k8s jobs in namespace team-a\n"


def test_kubeconfig_env_with_missing_and_real_files(tmp_path, fake_api):
    """KUBECONFIG=a:b as kubectl merges it: a missing entry is skipped, the real one is used."""
    server = fake_api("ok")
    path = _kubeconfig(tmp_path, server.url)
    res = _invoke(["list"], env={"KUBECONFIG": f"{tmp_path / 'missing'}:{path}"})
    assert res.exit_code == 0, res.output
    assert server.requests and "/apis/kubeflow.org/v1/namespaces/team-a/pytorchjobs" in server.requests[0]


ENV_CASES = [
    ("rank-not-int", {"RANK": "abc", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "RANK"),
    ("world-size-zero", {"RANK": "0", "WORLD_SIZE": "0", "MASTER_ADDR": "h"}, "WORLD_SIZE"),
    ("rank-too-big", {"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "RANK"),
    ("master-port-word", {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "http"}, "MASTER_PORT"),
    ("pet-nnodes-word", {"PET_NNODES": "many", "PET_NPROC_PER_NODE": "2"}, "PET_NNODES"),
]


@pytest.mark.parametrize("name,env,needle", ENV_CASES, ids=[c[0] for c in ENV_CASES])
def test_bad_launch_environment(name, env, needle):
    from trainer.env import EnvError, resolve

    with pytest.raises(EnvError) as e:
        resolve(env, 0)
    assert needle in str(e.value) and "\n" not in str(e.value)


# ---- server behaviour ------------------------------------------------------------------------------


LIST_BODIES = {
    "ok": {"kind": "PyTorchJobList", "items": []},
    "null-items": {"kind": "PyTorchJobList", "items": None},  # how Go writes an empty (nil) slice
    "text-items": {"kind": "PyTorchJobList", "items": "none"},
    "null-body": None,  # JSON null for an object
}
_OURS = {"app.kubernetes.io/managed-by": "colbert-k8s", "app.kubernetes.io/instance": "demo"}


def _job(**fields) -> dict:
    """A PyTorchJob answer of this tool's job "demo", with ``fields`` (spec, status) as given."""
    return {"kind": "PyTorchJob", "metadata": {"name": "demo", "labels": _OURS}, "spec": {}, **fields}


# what a real API server never answers (its CRD schema types these fields); status, logs and delete read them
LIST_BODIES |= {
    "metadata-text": {"kind": "PyTorchJob", "metadata": "demo"},
    "status-text": _job(status="Running"),
    "conditions-text": _job(status={"conditions": "Succeeded"}),
    "condition-null": _job(status={"conditions": [None]}),
    "replica-status-text": _job(status={"replicaStatuses": {"Master": "running"}}),
    "replica-specs-list": _job(spec={"pytorchReplicaSpecs": [{"replicas": 1}]}),
    "list-status-text": {"kind": "PyTorchJobList", "items": [_job(status="Running")]},
    "containers-text": _job(spec={"pytorchReplicaSpecs": {"Master": {"template": {"spec": {"containers": "c"}}}}}),
}


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def _answer(self):
        server = self.server
        server.requests.append(f"{self.command} {self.path}")
        mode = server.mode
        if mode == "stall":
            time.sleep(60)
            return
        if mode == "html":
            body, ctype, status = b"<html><body>Sign in</body></html>", "text/html", 200
        elif mode in LIST_BODIES:
            body, ctype, status = json.dumps(LIST_BODIES[mode]).encode(), "application/json", 200
        else:
            status = int(mode)
            body = json.dumps({"kind": "Status", "status": "Failure", "message": f"fake {status}"}).encode()
            ctype = "application/json"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = do_PATCH = _answer


@pytest.fixture
def fake_api():
    servers = []

    def start(mode: str):
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        srv.daemon_threads = True
        srv.mode, srv.requests = mode, []
        srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def _kubeconfig(tmp: Path, server: str) -> Path:
    path = tmp / "kubeconfig.yaml"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
        f"clusters: [{{name: fake, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: u, user: {token: abc}}]\n"
        "contexts: [{name: fake, context: {cluster: fake, user: u, namespace: team-a}}]\n"
    )
    return path


def _cluster_args(cmd: list[str], config: Path) -> list[str]:
    if cmd[0] == "submit":
        return [*cmd, "--config", str(config), "--name", "demo", "--gpus-per-node", "0"]
    return cmd


SERVER_CASES = [
    ("stall-status", "stall", ["status", "demo"], "did not answer"),
    ("stall-list", "stall", ["list"], "did not answer"),
    ("stall-delete", "stall", ["delete", "demo"], "did not answer"),
    ("stall-logs", "stall", ["logs", "demo"], "did not answer"),
    ("stall-submit", "stall", ["submit"], "did not answer"),
    ("html-status", "html", ["status", "demo"], "like a Kubernetes API server"),
    ("html-list", "html", ["list"], "like a Kubernetes API server"),
    ("404-status", "404", ["status", "demo"], "not found"),
    ("403-list", "403", ["list"], "403"),
    ("409-submit", "409", ["submit"], "409"),
    ("422-submit", "422", ["submit"], "422"),
    ("500-list", "500", ["list"], "500"),
    ("text-items-list", "text-items", ["list"], "without a list of objects in items"),
    ("null-status", "null-body", ["status", "demo"], "like a Kubernetes API server (got null)"),
    ("null-logs", "null-body", ["logs", "demo"], "like a Kubernetes API server (got null)"),
    ("metadata-text-status", "metadata-text", ["status", "demo"], "like a Kubernetes API server (its metadata is str)"),
    ("status-text-status", "status-text", ["status", "demo"], "malformed job (status is str, not an object)"),
    ("status-text-delete", "status-text", ["delete", "demo"], "malformed job (status is str"),
    ("conditions-text-status", "conditions-text", ["status", "demo"], "malformed job (status.conditions is str"),
    ("condition-null-status", "condition-null", ["status", "demo"], "(status.conditions.* is NoneType"),
    ("replica-text-status", "replica-status-text", ["status", "demo"], "(status.replicaStatuses.* is str"),
    ("replica-specs-logs", "replica-specs-list", ["logs", "demo"], "(spec.pytorchReplicaSpecs is list"),
    ("containers-text-logs", "containers-text", ["logs", "demo"], "template.spec.containers is str, not a list"),
    ("object-for-list", "status-text", ["list"], "without a list of objects in items"),
    ("status-text-list", "list-status-text", ["list"], "answered list PyTorchJob with a malformed job"),
]


@pytest.mark.parametrize("name,mode,cmd,needle", SERVER_CASES, ids=[c[0] for c in SERVER_CASES])
def test_server_behaviour(name, mode, cmd, needle, fake_api, tmp_path, config):
    server = fake_api(mode)
    kubeconfig = _kubeconfig(tmp_path, server.url)
    started = time.monotonic()
    args = [*_cluster_args(cmd, config), "--kubeconfig", str(kubeconfig), "--request-timeout", "2"]
    res = _invoke(args)
    elapsed = time.monotonic() - started
    _assert_one_line(res, needle)
    assert server.requests, "the command never reached the server"
    if mode == "stall":
        assert len(server.requests) == 1  # a stalled server is not asked again
        assert elapsed < 30
    if mode == "500":
        assert len(server.requests) == 4  # a read is retried (3 times, with backoff)
    if mode in ("409", "422"):
        assert all(not r.startswith("POST") or "pytorchjobs" in r or "configmaps" in r for r in server.requests)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "Demo", "demo\n", "x" * 64], ids=repr)
def test_bad_names_never_reach_the_server(name, fake_api, tmp_path):
    server = fake_api("ok")
    kubeconfig = _kubeconfig(tmp_path, server.url)
    for cmd in ("delete", "status", "logs"):
        res = _invoke([cmd, name, "--kubeconfig", str(kubeconfig)])
        _assert_one_line(res, "NAME must be a job name")
    assert server.requests == []


@pytest.mark.parametrize(
    "mode",
    # 500: every check waits out the transport's retries with their back-off
    ["null-items", "text-items", "null-body", "html", "list-status-text", pytest.param("500", marks=pytest.mark.slow)],
)
def test_doctor_reports_a_server_it_cannot_read_one_check_at_a_time(mode, fake_api, tmp_path):
    """Each check reads its own answer: a list of null, of text or of the wrong objects was "internal error"
    (a KeyError from the client's models, a None iterated); now each check says it could not check."""
    server = fake_api(mode)
    res = _invoke(["doctor", "--kubeconfig", str(_kubeconfig(tmp_path, server.url)), "--request-timeout", "2"])
    assert res.exit_code == 2, res.output  # no job API could be confirmed: FAIL
    assert "internal error" not in res.output and "Traceback" not in res.output
    rows = res.output.splitlines()[1:]
    assert len(rows) >= 9 and all(" FAIL " in r or " WARN " in r or " OK " in r for r in rows), res.output


BAD_CLUSTER_FLAGS = [
    (["resize", "demo", "--nodes", "0"], "--nodes must be between 1 and 1024, got 0"),
    (["resize", "demo", "--nodes", "2000"], "--nodes must be between 1 and 1024, got 2000"),
    (["resize", "demo", "--nodes", "2", "--gpus-per-node", "99"], "--gpus-per-node must be between 0 and 16"),
    (["logs", "demo", "--rank", "-1"], "-1 is not in the range x>=0"),
]


@pytest.mark.parametrize("args,needle", BAD_CLUSTER_FLAGS, ids=[" ".join(a) for a, _ in BAD_CLUSTER_FLAGS])
def test_bad_flags_of_cluster_commands_never_reach_the_server(args, needle, fake_api, tmp_path):
    """resize read the job first and refused its --nodes after; kubectl checks its flags before any request."""
    server = fake_api("ok")
    _assert_one_line(_invoke([*args, "--kubeconfig", str(_kubeconfig(tmp_path, server.url))]), needle)
    assert server.requests == []


def test_credentials_in_the_server_url_are_not_shown(tmp_path):
    port = free_port()  # a port nobody listens on: connection refused
    kubeconfig = _kubeconfig(tmp_path, f"http://admin:s3cr3t-pass@127.0.0.1:{port}")
    res = _invoke(["list", "--kubeconfig", str(kubeconfig), "--request-timeout", "2"])
    _assert_one_line(res, "cannot reach the cluster at http://127.0.0.1")


def test_wait_has_a_deadline(fake_api, tmp_path, config, monkeypatch):
    """`submit --wait --timeout` ends with one line while the job is still running."""
    from operator_cli import follow

    class Running:
        def get_job(self, name):
            return {"status": {"conditions": [{"type": "Running", "status": "True"}]}}

    lines: list[str] = []
    from operator_cli.errors import CliError

    started = time.monotonic()
    with pytest.raises(CliError) as e:
        follow.wait_for_job(Running(), "demo", 0.05, 0.5, lambda m, **k: lines.append(m))
    assert time.monotonic() - started < 5
    assert "still Running after --timeout 0.5s" in e.value.message and e.value.exit_code == 1
    assert lines and lines[0].endswith("demo: Running")


CREDENTIALS = [
    ("https://user:pw@host/x", "URL"),
    ("https://ghp_token@github.com/org/repo", "URL"),
    (SECRET, "Hugging Face"),
    ("ghp_" + "a1B2" * 9, "GitHub"),
    ("github_pat_" + "11ABC_" * 8, "GitHub"),
    ("glpat-" + "x" * 20, "GitLab"),
    ("key=AKIAABCDEFGHIJKLMNOP;", "AWS"),
    ("sk-" + "a1" * 24, "API key"),
    ("sk-proj-" + "Ab_-" * 8, "API key"),
    ("xoxb-1234567890-abcdef", "Slack"),
    ("AIza" + "B" * 35, "Google"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----", "private key"),
    ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig", "JSON web token"),
    ("https://a.blob.core.windows.net/c/t.jsonl?sv=2022-11-02&sp=r&sig=AbC%2Bd%3D", "signed URL"),
    ("sv=2022-11-02&ss=b&srt=o&sig=AbC%2Bd%3D", "signed URL"),  # a SAS token alone
    ("https://storage.googleapis.com/b/o?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Signature=0a1b", "signed URL"),
    ("https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=0a1b", "signed URL"),
    ("https://b.s3.amazonaws.com/k?x-amz-security-token=FwoGZXIvYXdzE", "signed URL"),
    # lookalikes that are not credentials
    ("s3://bucket/dir@2024/train.jsonl", None),
    ("reg.io/team/img:1.0@sha256:" + "0a" * 32, None),
    ("my-sk-learn-baseline-experiment-01", None),
    ("task-abcdefghijklmnopqrstuvwxyz0123456789", None),
    ("hf_cache_dir", None),
    ("AKIAABCDEFGHIJKLMNOPQRS", None),  # 23 characters: not a 20-character key id
    ("sentence-transformers/all-MiniLM-L6-v2", None),
    ("s3://b/runs/sig=2024/t.jsonl", None),  # not a query parameter
    ("https://h.example/x?design=1&signature_count=2", None),
]


@pytest.mark.parametrize("value,kind", CREDENTIALS, ids=[f"{i}-{c[1]}" for i, c in enumerate(CREDENTIALS)])
def test_credential_values_and_their_lookalikes(value, kind):
    """The one pattern behind the CLI's, the config's and the chart's refusals: it finds each documented token
    format, and leaves names that merely look alike (a digest, a run name) alone."""
    import re

    from trainer.config.credentials import CREDENTIAL_VALUE, credential_in

    found = credential_in(value)
    assert (found is None) if kind is None else (found is not None and kind in found), found
    assert bool(re.search(CREDENTIAL_VALUE, value)) == (kind is not None)  # the chart's pattern agrees


class _EventsHandler(http.server.BaseHTTPRequestHandler):
    """A server that answers the job and its (empty) pods well, and its events badly."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        if "/events" in self.path:
            if self.server.mode == "stall":
                time.sleep(10)
                return
            body = {"kind": "EventList", "items": "none"}
        elif "/pods" in self.path:
            body = {"kind": "PodList", "items": []}
        elif "/pytorchjobs/demo" in self.path:
            body = _job(status={"conditions": [{"type": "Running", "status": "True"}]})
        else:
            body = {"kind": "Status", "code": 404}
        data = json.dumps(body).encode()
        self.send_response(body.get("code", 200))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.mark.parametrize("mode", ["malformed", "stall"])
def test_events_that_fail_leave_status_whole(mode, tmp_path):
    """Events are a nicety: a malformed list was "internal error", a stalled one was not bounded by the
    request timeout's one line; status now shows the job without them."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EventsHandler)
    srv.daemon_threads, srv.mode = True, mode
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        kubeconfig = _kubeconfig(tmp_path, f"http://127.0.0.1:{srv.server_address[1]}")
        res = _invoke(["status", "demo", "--kubeconfig", str(kubeconfig), "--request-timeout", "1"])
    finally:
        srv.shutdown()
        srv.server_close()
    assert res.exit_code == 0, res.output
    assert "demo: Running" in res.output and "error" not in res.output
