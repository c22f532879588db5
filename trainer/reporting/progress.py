"""Progress for people and tools outside the pod: the TrainJob's own status, and one structured log line.

**One progress for the whole job.** A job is a list of phases in the order it runs (:func:`job_plan`):
for each mining round, *encode corpus* (or *index corpus* for BM25), *search queries*, *teacher scores*
(with ``mine.teacher``), then the round's *train*; a job without mining is one *train* phase. Each
phase counts items (rank 0's corpus chunks, parts of queries, optimizer steps) and is worth work units
estimated up front from the config, one unit being one text through the encoder:

* encode corpus: one unit per document (BM25's index: none; it is quick beside a model's passes);
* search queries: one unit per distinct query (its encoding; MaxSim against the corpus is not counted);
* teacher scores: one unit per (query, document) pair the teacher scores: rows x (1 + ``mine.negatives``);
* train: per step, global batch x (query + positive + negatives) x 3 (forward and backward).

Training steps are estimated from ``training.max_steps``, or the epochs over data.train's rows (mining
keeps at most those), and corrected when the round builds its data. The percentage is the units done
over all units, never lower than the last one posted, and 99 at most until the very end, where 100%
is posted once (:meth:`Progress.close`). The ETA is what is left at the speed this process has had so
far (units it did over the time it ran): phases of different real speed make it a rough figure. A
restarted job starts from what its finished phases (rounds with ``metrics.json``, mined parts, the
checkpoint's step) already did. The export, when asked for, is the last phase (a twentieth of the rest;
its items the files sent). Evaluation, checkpoints and the index are not counted.

* **TrainJob status (Kubeflow Trainer's TrainJobStatus, KEP-2779).** When the Trainer injects its
  endpoint (``KUBEFLOW_TRAINER_SERVER_URL``, or the KEP's ``KUBEFLOW_TRAINER_STATUS_URL``, with the
  CA and token file paths beside it), rank 0 POSTs ``{"trainerStatus": {progressPercentage,
  estimatedRemainingSeconds, metrics, lastUpdatedTime}}`` as the Kubeflow SDK and ``kubectl get
  trainjob -o jsonpath='{.status.trainerStatus}'`` read it; ``metrics`` carries the ``phase``
  ("mining round 2/2: encode corpus 3/6"). A background thread sends at most one request per
  ``interval`` (5 s), re-reads the token file each time (it rotates) and verifies the CA. A phase only
  hands over its numbers; a stalled or failing server never raises and never delays one.
* **A log line** ``progress {...}`` (JSON, with ``phase``) at every ``training.log_every`` steps, at
  each phase's start and at most every ``interval`` within a mining phase: ``colbert-k8s status``
  reads the newest one from rank 0's log.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from trainer.config.schema import TrainConfig
from trainer.redirects import opener, redact, redirect_line
from trainer.retrieval import RETRIEVERS
from trainer.scale import job_scale

__all__ = ["LOG_PREFIX", "Phase", "Progress", "endpoint", "job_plan", "with_export"]

log = logging.getLogger("trainer")
LOG_PREFIX = "progress "
_VARS = [
    (f"KUBEFLOW_TRAINER_{kind}_URL", f"KUBEFLOW_TRAINER_{kind}_CA_CERT", f"KUBEFLOW_TRAINER_{kind}_TOKEN")
    for kind in ("SERVER", "STATUS")
]


def endpoint(env: Mapping[str, str]) -> tuple[str, str | None, str | None] | None:
    """(url, CA file, token file) when the Trainer injected its status endpoint, else None."""
    for url, ca, token in _VARS:
        if env.get(url):
            return env[url], env.get(ca), env.get(token)
    return None


def _endpoint_problem(url: str, ca: str | None, token: str | None) -> str | None:
    """What makes the injected endpoint unusable from the start, named once instead of warned every step."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        return f"{redact(url)[:120]!r} is not an http(s) URL"
    for what, path in (("CA certificate", ca), ("token file", token)):
        if path and not os.path.isfile(path):
            return f"{what} {path[:200]} is not a file"
    return None


@dataclass
class Phase:
    """One phase of the job: ``items`` (rank 0's corpus chunks, parts of queries, steps) worth ``units`` of
    work in all; ``done`` of them done, ``before`` of those by an earlier run (they count for the
    percentage, not for the speed)."""

    round: int
    kind: str  # encode, search, teacher, train
    name: str  # what ``status`` shows before the counts
    items: int
    units: float
    done: int = 0
    before: int = 0

    def share(self, items: int) -> float:
        """The units ``items`` of this phase's items are worth."""
        return self.units * min(items, self.items) / self.items if self.items else self.units

    def text(self) -> str:
        return f"{self.name}{' step' if self.kind == 'train' else ''} {self.done}/{self.items}"


def _steps(cfg: TrainConfig, world_size: int, rows: int) -> int:
    """Optimizer steps a round trains, as ``trainer/data``'s schedule counts them, for ``rows`` rows."""
    t = cfg.training
    if t.max_steps:
        return t.max_steps
    return max(1, math.ceil(t.epochs * (rows // job_scale(cfg, world_size).global_batch)))


def job_plan(cfg: TrainConfig, world_size: int, rows: int, queries: int, documents: int, chunk: int) -> list[Phase]:
    """The phases of ``cfg``'s job on ``world_size`` ranks, in order, weighed as the module docstring says:
    data.train has ``rows`` (query, positive) rows of ``queries`` distinct queries, and the corpus
    ``documents`` documents in chunks of ``chunk``, dealt round-robin (rank 0 encodes its share).

    >>> from trainer.config.load import parse_config
    >>> cfg = parse_config({"data": {"train": {"path": "t.jsonl"}}, "training": {"max_steps": 10,
    ...     "per_device_batch_size": 4}, "mine": {"rounds": 2, "retriever": "bm25", "negatives": 1}})
    >>> [(p.name, p.items, p.units) for p in job_plan(cfg, 2, rows=100, queries=80, documents=3000, chunk=512)]
    ... # doctest: +NORMALIZE_WHITESPACE
    [('mining round 1/2: index corpus (BM25)', 1, 0), ('mining round 1/2: search queries', 1, 80),
     ('round 1/2: train', 10, 720), ('mining round 2/2: encode corpus', 3, 3000),
     ('mining round 2/2: search queries', 1, 80), ('round 2/2: train', 10, 720)]
    """
    steps = _steps(cfg, world_size, rows)
    scale = job_scale(cfg, world_size)
    per_step = scale.global_batch * (1 + scale.docs_per_query) * 3  # a query and its documents, forward and back
    if cfg.mine is None:
        return with_export(cfg, [Phase(1, "train", "train", steps, steps * per_step)])
    m, total = cfg.mine, cfg.mine.rounds
    parts = max(1, math.ceil(queries / m.query_chunk))
    own_chunks = max(1, math.ceil(math.ceil(documents / chunk) / world_size))  # rank 0's: 0, W, 2W, ...
    plan = []
    for r in range(1, total + 1):
        head = f"mining round {r}/{total}: "
        if r == 1 and not RETRIEVERS[m.retriever].needs_model:
            plan.append(Phase(r, "encode", head + "index corpus (BM25)", 1, 0))
        else:  # PLAID encodes rank 0's share in one call
            chunks = 1 if m.retriever == "plaid" else own_chunks
            plan.append(Phase(r, "encode", head + "encode corpus", chunks, documents))
        plan.append(Phase(r, "search", head + "search queries", parts, queries))
        if m.teacher is not None:
            plan.append(Phase(r, "teacher", head + "teacher scores", parts, rows * (1 + m.negatives)))
        plan.append(Phase(r, "train", f"round {r}/{total}: train", steps, steps * per_step))
    return with_export(cfg, plan)


def with_export(cfg: TrainConfig, plan: list[Phase]) -> list[Phase]:
    """``plan`` with the export last when the config asks for one: worth a twentieth of the rest (a network
    copy of the model, not a pass of the encoder), its items the files sent.

    >>> from trainer.config.load import parse_config
    >>> cfg = parse_config({"data": {"train": {"path": "t.jsonl"}}, "training": {"max_steps": 10},
    ...     "export": {"destination": "s3://models/run/"}})
    >>> [(p.name, p.units) for p in with_export(cfg, [Phase(1, "train", "train", 10, 100.0)])]
    [('train', 100.0), ('export', 5.0)]
    """
    if cfg.export is None:
        return plan
    last = plan[-1].round if plan else 1
    return [*plan, Phase(last, "export", "export", 1, 0.05 * sum(p.units for p in plan))]


class Progress:
    """Rank 0's one progress over the job's phases (every method is a no-op elsewhere): ``begin``,
    ``advance`` and ``skip`` from mining and rounds; ``train``, ``step``, ``evaluated`` and ``finish`` from
    training; ``close``, the 100%, once at the very end. Without a ``plan``: one training phase."""

    def __init__(
        self,
        total_steps: int = 1,
        start_step: int = 0,
        env: Mapping[str, str] | None = None,
        enabled: bool = True,
        interval: float = 5.0,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        plan: list[Phase] | None = None,
    ):
        steps = max(1, total_steps)
        self.plan = plan or [Phase(1, "train", "train", steps, float(steps), start_step, start_step)]
        self.round = 1  # the round the phases named by kind belong to (trainer/rounds.py sets it)
        self.enabled, self.interval, self.timeout, self.clock = enabled, interval, timeout, clock
        self.started = clock()
        self.latest: dict = {}
        self.best: dict | None = None
        self.target = endpoint(os.environ if env is None else env) if enabled else None
        self._last = self.plan[-1]  # its end is the job's end
        self._current: Phase | None = None
        self._percent = 0  # the last one published: the next is never lower
        self._finished = False
        self._last_line = float("-inf")
        self._cond = threading.Condition()
        self._pending: dict | None = None
        self._closing = False
        self._last_sent = float("-inf")
        self._warned: set[str] = set()
        self._thread = None
        if self.target and (problem := _endpoint_problem(*self.target)):
            log.warning("the TrainJob's status endpoint %s; progress goes to the log only", problem)
            self.target = None
        if self.target and self.target[2] and not self.target[0].lower().startswith("https://"):
            log.warning(
                "the TrainJob's status endpoint %s is not https: progress is posted without the token "
                "(it would travel in clear)",
                redact(self.target[0]),
            )
            self.target = (self.target[0], self.target[1], None)
        if self.target:
            self._thread = threading.Thread(target=self._send_loop, name="trainer-status", daemon=True)
            self._thread.start()
            log.info("reporting progress to the TrainJob's status at %s", redact(self.target[0]))

    # ---- from the phases ---------------------------------------------------------------------------
    def begin(self, kind: str, items: int | None = None, done: int = 0) -> Progress:
        """Enter the current round's ``kind`` phase. ``items``: its count, known now (each item keeps the
        units the plan gave it); ``done``: items an earlier run of the job did."""
        if not self.enabled:
            return self
        p = self._phase(kind)
        if items is not None and max(1, items) != p.items:
            p.units, p.items = p.units / p.items * max(1, items), max(1, items)
        p.before = max(p.before, min(done, p.items))
        p.done = max(p.done, p.before)
        if kind == "train" and p is not self._current:  # a new round's training: its own loss and best
            self.latest, self.best = {}, None
        self._current = p
        self._publish()
        return self

    def advance(self, kind: str, n: int | None = 1) -> None:
        """``n`` more items of ``kind`` done by this process (None: every one left). The log line comes at
        the phase's end and at most once per ``interval`` before it."""
        if not self.enabled:
            return
        p = self._phase(kind)
        p.done = p.items if n is None else min(p.items, p.done + n)
        self._publish(line=p.done == p.items or self.clock() - self._last_line >= self.interval)

    def skip(self, *kinds: str) -> None:
        """The current round's ``kinds`` phases (all of them when none is named) were done by an earlier run."""
        for p in self.plan:
            if p.round == self.round and (not kinds or p.kind in kinds):
                p.done = p.before = p.items

    # ---- from training -----------------------------------------------------------------------------
    def train(self, total_steps: int, step: int) -> Progress:
        """The round's training starts (or resumes) at ``step`` of ``total_steps``."""
        return self.begin("train", items=total_steps, done=step)

    def step(self, step: int, loss: float, lr: float, samples_per_second: float, hardness: dict | None = None) -> None:
        """A log step: the loss, the rate, and how hard the negatives still are (margin, easy share)."""
        if not self.enabled:
            return
        self.latest = {**self.latest, "loss": loss, "lr": lr, "samples_per_second": samples_per_second}
        self.latest.update(hardness or {})
        self._at_step(step)
        self._publish()

    def evaluated(self, step: int, metric: str, result: dict[str, float]) -> None:
        if not self.enabled:
            return
        if self.best is None or result[metric] > self.best["value"]:
            self.best = {"metric": metric, "value": result[metric], "step": step}
        self.latest = {**self.latest, **{f"eval_{k}": v for k, v in result.items()}}  # kept until the next one
        self._at_step(step)
        self._publish()

    def finish(self, step: int) -> None:
        """A round's training ended: the job's 100% when it was the job's last phase, else one more update."""
        if not self.enabled:
            return
        p = self._at_step(step)
        p.done = p.items
        if p is self._last:
            self.close()
        else:
            self._publish()

    def close(self) -> None:
        """The 100% update, once, at the very end of the job: sent now (bounded by ``timeout``), never
        dropped by the throttle."""
        if not self.enabled or self._finished:
            return
        self._finished = True
        body = self._publish(final=True)
        if self._thread is not None:
            with self._cond:
                self._closing = True
                self._cond.notify()
            self._thread.join(timeout=self.timeout + 1)
            final = threading.Thread(target=self._post, args=(body,), name="trainer-status-final", daemon=True)
            final.start()  # a server that answers a byte at a time cannot hold the job past this deadline
            final.join(timeout=self.timeout)

    # ---- the two outputs --------------------------------------------------------------------------
    def _phase(self, kind: str) -> Phase:
        for p in self.plan:
            if p.round == self.round and p.kind == kind:
                return p
        p = Phase(self.round, kind, kind, 1, 0.0)  # one the plan left out: shown, worth nothing
        self.plan.append(p)
        return p

    def _at_step(self, step: int) -> Phase:
        p = self._current = self._phase("train")
        p.done = max(p.done, min(step, p.items))
        return p

    def _publish(self, final: bool = False, line: bool = True) -> dict:
        total = sum(p.units for p in self.plan)
        done = sum(p.share(p.done) for p in self.plan)
        worked = sum(p.share(p.done) - p.share(p.before) for p in self.plan)  # by this process
        if final:
            percent, eta = 100, 0
        else:
            if total:
                self._percent = max(self._percent, min(99, int(100 * done / total)))
            percent = self._percent if total else None
            eta = round((self.clock() - self.started) / worked * (total - done)) if worked > 0 else None
        cur = self._current
        record = {"phase": cur.text() if cur else "done", "percent": percent, "eta_seconds": eta}
        training = cur is not None and cur.kind == "train"
        if training:
            record = {**self.latest, **record, "step": cur.done, "total": cur.items}
            if self.best:
                record["best"] = self.best
        if line:
            self._last_line = self.clock()
            log.info("%s%s", LOG_PREFIX, json.dumps(record, sort_keys=True))
        body = self._body(record, training)
        if self.target and not final:
            with self._cond:
                self._pending = body
                self._cond.notify()
        return body

    def _body(self, record: dict, training: bool) -> dict:
        shown = {**self.latest, "step": record["step"], "totalSteps": record["total"]} if training else {}
        metrics = [{"name": "phase", "value": record["phase"]}]
        metrics += [{"name": k, "value": f"{v:.6g}" if isinstance(v, float) else str(v)} for k, v in shown.items()]
        status: dict = {
            "metrics": metrics,
            "lastUpdatedTime": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        if record["percent"] is not None:
            status["progressPercentage"] = record["percent"]
        if record["eta_seconds"] is not None:
            status["estimatedRemainingSeconds"] = record["eta_seconds"]
        return {"trainerStatus": status}

    def _send_loop(self) -> None:
        """At most one POST per ``interval``; a newer update replaces one still waiting."""
        while True:
            with self._cond:
                while self._pending is None and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
                wait = self._last_sent + self.interval - self.clock()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                body, self._pending = self._pending, None
            self._post(body)
            self._last_sent = self.clock()

    def _post(self, body: dict) -> None:
        """One request; every failure is a warning (once per kind), never an exception."""
        url, ca, token_file = self.target
        try:
            headers = {"Content-Type": "application/json"}
            if token_file:
                with open(token_file) as f:  # re-read: projected tokens rotate
                    headers["Authorization"] = f"Bearer {f.read().strip()}"
            context = ssl.create_default_context(cafile=ca) if url.lower().startswith("https") else None
            request = urllib.request.Request(redact(url), json.dumps(body).encode(), headers, method="POST")
            with opener(context).open(request, timeout=self.timeout) as response:
                response.read()
        except Exception as e:  # progress must never stop training
            kind = type(e).__name__
            if isinstance(e, urllib.error.HTTPError) and 300 <= e.code < 400:
                fix = "the status URL the Trainer injects must be the endpoint itself; check the Trainer's settings"
                line = redirect_line(redact(url), e.code, e.headers.get("Location"), fix)
                kind, e = "redirect", RuntimeError(line)
            if kind not in self._warned:
                self._warned.add(kind)
                log.warning(
                    "could not report progress to the TrainJob's status (%s: %s); the job goes on",
                    kind,
                    str(e).splitlines()[0][: 400 if kind == "redirect" else 160] if str(e) else "",
                )
