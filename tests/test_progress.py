"""Progress into the TrainJob's status (trainer/reporting/progress.py) against a real local HTTPS server with its own
CA: a token file that rotates, a server that stalls, one that answers 500, one whose certificate is not trusted."""

from __future__ import annotations

import http.server
import json
import logging
import os
import ssl
import threading
import time
from pathlib import Path

import pytest
import trustme

from trainer.reporting.progress import LOG_PREFIX, Progress


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, mode: str, cert: trustme.LeafCert):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.mode, self.requests = mode, []
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(context)
        self.socket = context.wrap_socket(self.socket, server_side=True)
        self.url = f"https://localhost:{self.server_address[1]}/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs/demo/status"


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests.append((time.monotonic(), self.headers.get("Authorization"), json.loads(body)))
        if self.server.mode == "stall":
            time.sleep(30)
        code = 500 if self.server.mode == "500" else 200
        self.send_response(code)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def tls(tmp_path):
    ca = trustme.CA()
    ca_file = tmp_path / "ca.crt"
    ca.cert_pem.write_to_path(str(ca_file))
    servers = []

    def start(mode: str = "ok") -> tuple[_Server, dict[str, str]]:
        server = _Server(mode, ca.issue_cert("localhost"))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        token = tmp_path / "token"
        token.write_text("token-1")
        env = {
            "KUBEFLOW_TRAINER_SERVER_URL": server.url,
            "KUBEFLOW_TRAINER_SERVER_CA_CERT": str(ca_file),
            "KUBEFLOW_TRAINER_SERVER_TOKEN": str(token),
        }
        return server, env

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def _validates(body: dict) -> None:
    """The body is what the Trainer's API accepts: kubeflow-trainer-api's request model, losslessly."""
    from kubeflow_trainer_api.models.trainer_v1alpha1_update_train_job_status_request import (
        TrainerV1alpha1UpdateTrainJobStatusRequest as Request,
    )

    parsed = Request.from_dict(body)
    assert parsed.trainer_status is not None
    again = parsed.to_dict()
    assert again["trainerStatus"]["metrics"] == body["trainerStatus"]["metrics"]
    assert again["trainerStatus"].get("progressPercentage") == body["trainerStatus"].get("progressPercentage")
    assert again["trainerStatus"]["lastUpdatedTime"].tzinfo is not None  # RFC 3339 with its zone


def _wait(predicate, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_throttled_posts_with_a_rotating_token_and_a_final_100(tls):
    server, env = tls("ok")
    progress = Progress(total_steps=100, start_step=0, env=env, interval=0.5)
    for step in range(1, 41):  # 40 steps in a burst: one request, not 40
        progress.step(step, loss=1.0 / step, lr=1e-5, samples_per_second=32.0)
    _wait(lambda: len(server.requests) >= 1)
    time.sleep(0.2)
    assert len(server.requests) == 1
    Path(env["KUBEFLOW_TRAINER_SERVER_TOKEN"]).write_text("token-2")  # the projected token rotated
    progress.evaluated(50, "ndcg@10", {"ndcg@10": 0.71, "mrr@10": 0.66})
    _wait(lambda: len(server.requests) >= 2)
    progress.step(60, loss=0.2, lr=1e-5, samples_per_second=32.0)
    progress.finish(100)  # right after: the throttle would hold it, the final update is sent anyway
    bodies = [b for _, _, b in server.requests]
    assert [a for _, a, _ in server.requests][:2] == ["Bearer token-1", "Bearer token-2"]
    assert server.requests[1][0] - server.requests[0][0] >= 0.45  # at most one request per interval
    final = bodies[-1]["trainerStatus"]
    assert final["progressPercentage"] == 100 and final["estimatedRemainingSeconds"] == 0
    assert {"name": "eval_ndcg@10", "value": "0.71"} in final["metrics"]
    assert bodies[0]["trainerStatus"]["progressPercentage"] < 100
    for body in bodies:
        _validates(body)


@pytest.mark.parametrize("mode", ["stall", "500", "untrusted"])
def test_a_bad_server_never_delays_a_step_nor_raises(mode, tls, tmp_path, caplog):
    server, env = tls("ok" if mode == "untrusted" else mode)
    if mode == "untrusted":  # a CA that did not sign the server's certificate
        other = tmp_path / "other-ca.crt"
        trustme.CA().cert_pem.write_to_path(str(other))
        env["KUBEFLOW_TRAINER_SERVER_CA_CERT"] = str(other)
    progress = Progress(total_steps=10, start_step=0, env=env, interval=0.1, timeout=1.0)
    slowest = 0.0
    with caplog.at_level(logging.WARNING, logger="trainer"):
        for step in range(1, 10):
            started = time.perf_counter()
            progress.step(step, loss=0.5, lr=1e-5, samples_per_second=10.0)
            slowest = max(slowest, time.perf_counter() - started)
            time.sleep(0.05)
        started = time.perf_counter()
        progress.finish(10)
        finishing = time.perf_counter() - started
    assert slowest < 0.05, slowest  # a step hands its numbers over and goes on (a POST takes >= 1 s here)
    assert finishing < 4.0  # the final update waits at most the request timeout, twice
    warnings = [r.getMessage() for r in caplog.records if "could not report progress" in r.getMessage()]
    assert warnings and len(warnings) == len(set(w.split(" (")[1].split(":")[0] for w in warnings))  # once per kind
    if mode == "untrusted":
        assert server.requests == []  # no byte of the token reached a server it could not verify


BAD_ENDPOINTS = [
    ("ftp", {"KUBEFLOW_TRAINER_STATUS_URL": "ftp://trainer/status"}, "'ftp://trainer/status' is not an http(s) URL"),
    ("no-scheme", {"KUBEFLOW_TRAINER_STATUS_URL": "trainer:8443"}, "'trainer:8443' is not an http(s) URL"),
    (
        "no-ca-file",
        {"KUBEFLOW_TRAINER_STATUS_URL": "https://t/s", "KUBEFLOW_TRAINER_STATUS_CA_CERT": "/var/run/none/ca.crt"},
        "CA certificate /var/run/none/ca.crt is not a file",
    ),
    (
        "no-token-file",
        {"KUBEFLOW_TRAINER_STATUS_URL": "https://t/s", "KUBEFLOW_TRAINER_STATUS_TOKEN": "/var/run/none/token"},
        "token file /var/run/none/token is not a file",
    ),
]


@pytest.mark.parametrize("name,env,message", BAD_ENDPOINTS, ids=[c[0] for c in BAD_ENDPOINTS])
def test_an_unusable_endpoint_is_named_once_and_training_goes_on(name, env, message, caplog):
    """Each of these warned at every step with urllib's words ("unknown url type", "[Errno 2]" without a path)."""
    with caplog.at_level(logging.WARNING, logger="trainer"):
        progress = Progress(total_steps=4, start_step=0, env=env, interval=0.0)
        for step in range(1, 4):
            progress.step(step, loss=0.5, lr=1e-5, samples_per_second=10.0)
        progress.finish(4)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and message in warnings[0], warnings
    assert progress._thread is None


def test_the_log_line_is_there_without_an_endpoint(caplog):
    progress = Progress(total_steps=40, start_step=10, env={})
    with caplog.at_level(logging.INFO, logger="trainer"):
        progress.step(20, loss=0.25, lr=2e-5, samples_per_second=16.0)
        progress.evaluated(20, "ndcg@10", {"ndcg@10": 0.5})
        progress.finish(40)
    lines = [
        json.loads(r.getMessage()[len(LOG_PREFIX) :]) for r in caplog.records if r.getMessage().startswith(LOG_PREFIX)
    ]
    assert lines[0]["step"] == 20 and lines[0]["total"] == 40 and lines[0]["percent"] == 50
    assert lines[0]["eta_seconds"] is not None and lines[0]["loss"] == 0.25
    assert lines[-1]["percent"] == 100 and lines[-1]["best"] == {"metric": "ndcg@10", "value": 0.5, "step": 20}


@pytest.mark.slow
def test_a_training_run_reports_and_survives_a_failing_endpoint(tls, tmp_path, tiny_model):
    """The trainer itself, with the Trainer's variables set and an endpoint answering 500: it trains to the
    end, warns once, logs its progress lines, and its last update says 100%."""
    import subprocess
    import sys

    import yaml

    from tests.helpers import ROOT, write_triplets

    server, env = tls("500")
    data = write_triplets(tmp_path / "t.jsonl", 16)
    cfg = {
        "model": {"name_or_path": str(tiny_model), "query_length": 16, "document_length": 32},
        "data": {"train": {"path": str(data)}, "cache_dir": str(tmp_path / "cache")},
        "training": {"per_device_batch_size": 4, "max_steps": 4, "log_every": 1},
        "evaluation": {"after_training": False},
        "output_dir": str(tmp_path / "out"),
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(cfg))
    res = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", str(tmp_path / "train.yaml")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout + res.stderr
    assert out.count("could not report progress") == 1 and "HTTPError" in out
    assert out.count(LOG_PREFIX + "{") >= 5  # one per step (log_every 1) and the final one
    assert server.requests and server.requests[-1][2]["trainerStatus"]["progressPercentage"] == 100
    assert server.requests[-1][1] == "Bearer token-1"


class _Plain(http.server.ThreadingHTTPServer):
    """A plain-http server on another port that records what reaches it, or redirects, or drips."""

    daemon_threads = True

    def __init__(self, mode: str = "record", location: str = ""):
        super().__init__(("127.0.0.1", 0), _PlainHandler)
        self.mode, self.location, self.requests = mode, location, []
        self.url = f"http://127.0.0.1:{self.server_address[1]}/status"
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _PlainHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))  # a followed redirect arrives as a GET
        self.server.requests.append(self.headers.get("Authorization"))
        if self.server.mode == "drip":  # headers, then one byte every 0.5 s
            self.send_response(200)
            self.send_header("Content-Length", "40")
            self.end_headers()
            for _ in range(40):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.5)
            return
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST

    def log_message(self, *args) -> None:
        pass


class _RedirectingHandler(_Handler):
    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests.append((time.monotonic(), self.headers.get("Authorization"), {}))
        self.send_response(302)
        self.send_header("Location", self.server.location)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_a_redirect_never_takes_the_token_to_another_server(tls, caplog):
    """A 302 from the CA-checked endpoint sent `Bearer <ServiceAccount token>` to a plain-http server on
    another port, once per update."""
    elsewhere = _Plain()
    server, env = tls()
    server.RequestHandlerClass = _RedirectingHandler
    server.location = elsewhere.url
    with caplog.at_level(logging.WARNING, logger="trainer"):
        progress = Progress(total_steps=4, start_step=0, env=env, interval=0.0, timeout=1.0)
        for step in range(1, 4):
            progress.step(step, loss=0.5, lr=1e-5, samples_per_second=10.0)
        progress.finish(4)
    _wait(lambda: len(server.requests) >= 1)
    assert server.requests[0][1] == "Bearer token-1"  # the endpoint itself got it
    assert elsewhere.requests == []  # the other server never saw a request, let alone the token
    assert any("HTTP 302, a redirect to" in r.getMessage() and "not followed" in r.getMessage() for r in caplog.records)
    elsewhere.shutdown()


def test_a_plain_http_endpoint_never_gets_the_token_and_user_info_is_not_logged(tmp_path, caplog):
    plain = _Plain()
    token = tmp_path / "token"
    token.write_text("secret-token")
    url = plain.url.replace("http://", "http://user:hunter2@")
    env = {"KUBEFLOW_TRAINER_SERVER_URL": url, "KUBEFLOW_TRAINER_SERVER_TOKEN": str(token)}
    with caplog.at_level(logging.INFO, logger="trainer"):
        progress = Progress(total_steps=2, start_step=0, env=env, interval=0.0, timeout=1.0)
        progress.step(1, loss=0.5, lr=1e-5, samples_per_second=10.0)
        progress.finish(2)
    _wait(lambda: plain.requests)
    assert all(auth is None for auth in plain.requests)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "is not https: progress is posted without the token" in text
    assert "hunter2" not in text and "user:" not in text
    plain.shutdown()


def test_the_final_post_is_bounded_by_the_timeout_whatever_the_server_does():
    """A server answering one byte every 0.5 s held rank 0 in the final post for 19.7 s against a 1 s timeout."""
    drip = _Plain("drip")
    progress = Progress(
        total_steps=2, start_step=0, env={"KUBEFLOW_TRAINER_SERVER_URL": drip.url}, interval=100.0, timeout=1.0
    )
    started = time.perf_counter()
    progress.finish(2)
    assert time.perf_counter() - started < 3.5  # the loop's join (timeout + 1) and the final post's (timeout)
    drip.shutdown()


# ---- one progress over every phase (issue 32) ---------------------------------------------------------


def _lines(caplog) -> list[dict]:
    return [
        json.loads(r.getMessage()[len(LOG_PREFIX) :]) for r in caplog.records if r.getMessage().startswith(LOG_PREFIX)
    ]


def _two_round_plan(**mine):
    from trainer.config.load import parse_config
    from trainer.reporting.progress import job_plan

    loss = {"loss": {"name": "distillation"}} if "teacher" in mine else {}
    training = {"max_steps": 4, "per_device_batch_size": 4}
    cfg = parse_config(
        {
            "data": {"train": {"path": "t.jsonl"}},
            "training": training,
            "mine": {"rounds": 2, "query_chunk": 16, **mine},
            **loss,
        }
    )
    return job_plan(cfg, 1, rows=48, queries=48, documents=1100, chunk=512)


def _run_round(progress: Progress, r: int, steps: int, teacher: bool = False) -> None:
    """What trainer/rounds.py, mine.py and train.py call for one round, in their order."""
    progress.round = r
    progress.begin("encode")
    for _ in range(3):  # 1100 documents: chunks of 512
        progress.advance("encode")
    progress.advance("encode", None)
    for _ in range(3):  # 48 queries, 16 per part
        progress.begin("search", items=3)
        progress.advance("search")
        if teacher:
            progress.begin("teacher", items=3)
            progress.advance("teacher")
    progress.train(steps, 0)
    for step in range(1, steps + 1):
        progress.step(step, loss=1.0, lr=1e-5, samples_per_second=8.0)
    progress.finish(steps)


@pytest.mark.parametrize("teacher", [False, True], ids=["retriever", "teacher"])
def test_a_two_round_job_is_one_progress_monotone_with_100_once_at_the_end(caplog, teacher):
    """A 2-round mining job posted 25, 100, 25, 100: each round's training restarted the progress, and mining
    reported nothing. Round 2 here even trains more steps than planned (epochs over more rows than estimated)."""
    extra = {"teacher": {"name_or_path": "t"}} if teacher else {}
    with caplog.at_level(logging.INFO, logger="trainer"):
        progress = Progress(plan=_two_round_plan(**extra), env={}, interval=0.0)
        _run_round(progress, 1, 4, teacher)
        _run_round(progress, 2, 9, teacher)
        progress.close()  # rounds.py's, after the last round: the 100% was sent already
    lines = _lines(caplog)
    percents = [line["percent"] for line in lines]
    assert percents == sorted(percents) and percents.count(100) == 1 and percents[-1] == 100, percents
    assert 0 < percents[len(percents) // 2] < 100
    phases = [line["phase"] for line in lines]
    assert "mining round 2/2: encode corpus 1/3" in phases and "mining round 1/2: search queries 3/3" in phases
    assert ("mining round 2/2: teacher scores 2/3" in phases) == teacher
    assert "round 1/2: train step 4/4" in phases and phases[-1] == "round 2/2: train step 9/9"
    round_2 = lines[phases.index("mining round 2/2: encode corpus 0/3")]
    assert "loss" not in round_2 and "step" not in round_2  # round 1's training figures stay with round 1
    assert all(line["eta_seconds"] is not None for line in lines[1:])


def test_a_restarted_job_starts_where_its_finished_phases_put_it(caplog):
    """Round 1 done before, round 2's rows mined before, its training resumed at step 2 of 4."""
    first = Progress(plan=_two_round_plan(), env={}, enabled=True)
    with caplog.at_level(logging.INFO, logger="trainer"):
        _run_round(first, 1, 4)
        first.round = 2
        first.skip("encode", "search", "teacher")
        first.train(4, 2)
        reached = _lines(caplog)[-1]["percent"]
        caplog.clear()
        again = Progress(plan=_two_round_plan(), env={})
        again.round = 1
        again.skip()
        again.round = 2
        again.skip("encode", "search", "teacher")
        again.train(4, 2)
    line = _lines(caplog)[0]
    assert line["percent"] == reached > 50 and line["phase"] == "round 2/2: train step 2/4"
    assert line["eta_seconds"] is None  # nothing done by this process yet: no speed to tell the time left by


def test_the_plan_examples_hold():
    import doctest

    import trainer.reporting.progress

    assert doctest.testmod(trainer.reporting.progress).failed == 0


@pytest.mark.slow
def test_a_two_round_mining_job_reports_one_progress_to_the_trainjob(tls, tmp_path, tiny_model):
    """The trainer itself: BM25 mines round 1, round 1's model round 2; every post to the TrainJob's status
    and every log line goes up, and 100% comes once, last. Restarted in round 2's training (its final model
    gone, a checkpoint left), it starts where the first run was at that point, not at 0."""
    import shutil
    import subprocess
    import sys

    import yaml

    from tests.helpers import ROOT, write_triplets
    from tests.helpers.mining import mining_job

    server, env = tls("ok")
    config = mining_job(tmp_path, tiny_model, write_triplets(tmp_path / "t.jsonl", 48), retriever="bm25", rounds=2)
    cfg = yaml.safe_load(config.read_text())
    cfg["training"]["log_every"] = 1
    config.write_text(yaml.safe_dump(cfg))

    def job() -> list[dict]:
        res = subprocess.run(
            [sys.executable, "-m", "trainer", "--config", str(config)],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        out = res.stdout + res.stderr
        return [
            json.loads(line[line.index(LOG_PREFIX) + len(LOG_PREFIX) :])
            for line in out.splitlines()
            if LOG_PREFIX + "{" in line
        ]

    def one_progress(percents: list[int]) -> None:
        assert percents == sorted(percents) and percents.count(100) == 1 and percents[-1] == 100, percents

    lines = job()
    posts = [body["trainerStatus"] for _, _, body in server.requests]
    one_progress([line["percent"] for line in lines])
    one_progress([post["progressPercentage"] for post in posts])
    assert len(posts) >= 2  # the first, and the 100% (more as the 5 s throttle lets through)
    for _, _, body in server.requests:
        _validates(body)
    phases = [line["phase"] for line in lines]
    for phase in (
        "mining round 1/2: index corpus (BM25) 1/1",
        "mining round 1/2: search queries 3/3",
        "round 1/2: train step 2/2",
        "mining round 2/2: encode corpus 1/1",
        "round 2/2: train step 1/2",
    ):
        assert phase in phases, phases
    assert {"name": "phase", "value": "round 2/2: train step 2/2"} in posts[-1]["metrics"]
    reached = lines[phases.index("round 2/2: train step 1/2")]["percent"]

    out = tmp_path / "out"
    (out / "metrics.json").unlink()
    shutil.rmtree(out / "final-model")
    server.requests.clear()
    again = job()
    assert again[0]["phase"] == "round 2/2: train step 1/2" and again[0]["percent"] == reached > 50
    one_progress([line["percent"] for line in again])
    one_progress([body["trainerStatus"]["progressPercentage"] for _, _, body in server.requests])
