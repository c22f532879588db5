"""Progress for people and tools outside the pod: the TrainJob's own status, and one structured log line.

* **TrainJob status (Kubeflow Trainer's TrainJobStatus, KEP-2779).** When the Trainer injects its
  endpoint (``KUBEFLOW_TRAINER_SERVER_URL``, or the KEP's ``KUBEFLOW_TRAINER_STATUS_URL``, with the
  CA and token file paths beside it), rank 0 POSTs ``{"trainerStatus": {progressPercentage,
  estimatedRemainingSeconds, metrics, lastUpdatedTime}}`` as the Kubeflow SDK and ``kubectl get
  trainjob -o jsonpath='{.status.trainerStatus}'`` read it. A background thread sends at most one
  request per ``interval`` (5 s), re-reads the token file each time (it rotates) and verifies the CA.
  A step only hands over its numbers; a stalled or failing server never raises and never delays one.
  The last update (100%) is sent when training ends, whatever the throttle says.
* **A log line** ``progress {...}`` (JSON) at every ``training.log_every`` steps, for both job kinds:
  ``colbert-k8s status`` reads the newest one from rank 0's log.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping

__all__ = ["LOG_PREFIX", "Progress", "endpoint"]

log = logging.getLogger("trainer")
LOG_PREFIX = "progress "
_VARS = [(f"KUBEFLOW_TRAINER_{kind}_URL", f"KUBEFLOW_TRAINER_{kind}_CA_CERT", f"KUBEFLOW_TRAINER_{kind}_TOKEN")
         for kind in ("SERVER", "STATUS")]  # fmt: skip


def endpoint(env: Mapping[str, str]) -> tuple[str, str | None, str | None] | None:
    """(url, CA file, token file) when the Trainer injected its status endpoint, else None."""
    for url, ca, token in _VARS:
        if env.get(url):
            return env[url], env.get(ca), env.get(token)
    return None


def redact(url: str) -> str:
    """``url`` without its user information, for logs.

    >>> redact("https://user:secret@status.example:8443/v1/x?a=1")
    'https://status.example:8443/v1/x?a=1'
    """
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx is an answer, not a new destination: the token goes only to the endpoint the Trainer named."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def _endpoint_problem(url: str, ca: str | None, token: str | None) -> str | None:
    """What makes the injected endpoint unusable from the start, named once instead of warned every step."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        return f"{redact(url)[:120]!r} is not an http(s) URL"
    for what, path in (("CA certificate", ca), ("token file", token)):
        if path and not os.path.isfile(path):
            return f"{what} {path[:200]} is not a file"
    return None


class Progress:
    """Rank 0's progress: ``step`` and ``evaluated`` from the loop, ``finish`` once at the end."""

    def __init__(
        self,
        total_steps: int,
        start_step: int,
        env: Mapping[str, str] | None = None,
        enabled: bool = True,
        interval: float = 5.0,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total, self.start_step, self.enabled = total_steps, start_step, enabled
        self.interval, self.timeout, self.clock = interval, timeout, clock
        self.started = clock()
        self.latest: dict = {}
        self.best: dict | None = None
        self.target = endpoint(os.environ if env is None else env) if enabled else None
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
            log.warning("the TrainJob's status endpoint %s is not https: progress is posted without the token "
                        "(it would travel in clear)", redact(self.target[0]))  # fmt: skip
            self.target = (self.target[0], self.target[1], None)
        if self.target:
            self._thread = threading.Thread(target=self._send_loop, name="trainer-status", daemon=True)
            self._thread.start()
            log.info("reporting progress to the TrainJob's status at %s", redact(self.target[0]))

    # ---- from the loop -----------------------------------------------------------------------------
    def step(self, step: int, loss: float, lr: float, samples_per_second: float) -> None:
        if not self.enabled:
            return
        self.latest = {**self.latest, "loss": loss, "lr": lr, "samples_per_second": samples_per_second}
        self._publish(step)

    def evaluated(self, step: int, metric: str, result: dict[str, float]) -> None:
        if not self.enabled:
            return
        if self.best is None or result[metric] > self.best["value"]:
            self.best = {"metric": metric, "value": result[metric], "step": step}
        self.latest = {**self.latest, **{f"eval_{k}": v for k, v in result.items()}}  # kept until the next one
        self._publish(step)

    def finish(self, step: int) -> None:
        """The 100% update: sent now (bounded by ``timeout``), never dropped by the throttle."""
        if not self.enabled:
            return
        body = self._publish(step, final=True)
        if self._thread is not None:
            with self._cond:
                self._closing = True
                self._cond.notify()
            self._thread.join(timeout=self.timeout + 1)
            final = threading.Thread(target=self._post, args=(body,), name="trainer-status-final", daemon=True)
            final.start()  # a server that answers a byte at a time cannot hold the job past this deadline
            final.join(timeout=self.timeout)

    # ---- the two outputs --------------------------------------------------------------------------
    def _publish(self, step: int, final: bool = False) -> dict:
        done = max(0, step - self.start_step)
        elapsed = self.clock() - self.started
        eta = 0 if final else (round(elapsed / done * (self.total - step)) if done else None)
        percent = 100 if final else min(99, int(100 * step / self.total)) if self.total else None
        line = {**self.latest, "step": step, "total": self.total, "percent": percent, "eta_seconds": eta}
        if self.best:
            line["best"] = self.best
        log.info("%s%s", LOG_PREFIX, json.dumps(line, sort_keys=True))
        body = self._body(step, percent, eta)
        if self.target and not final:
            with self._cond:
                self._pending = body
                self._cond.notify()
        return body

    def _body(self, step: int, percent: int | None, eta: int | None) -> dict:
        metrics = [{"name": k, "value": f"{v:.6g}" if isinstance(v, float) else str(v)} for k, v in self.latest.items()]
        metrics += [{"name": "step", "value": str(step)}, {"name": "totalSteps", "value": str(self.total)}]
        status: dict = {
            "metrics": metrics,
            "lastUpdatedTime": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        if percent is not None:
            status["progressPercentage"] = percent
        if eta is not None:
            status["estimatedRemainingSeconds"] = eta
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
            opener = urllib.request.build_opener(_NoRedirect, urllib.request.HTTPSHandler(context=context))
            with opener.open(request, timeout=self.timeout) as response:
                response.read()
        except Exception as e:  # noqa: BLE001 (progress must never stop training)
            kind = type(e).__name__
            if isinstance(e, urllib.error.HTTPError) and 300 <= e.code < 400:
                kind, e = "redirect", RuntimeError(f"HTTP {e.code}: a redirect, not followed (the token stays home)")
            if kind not in self._warned:
                self._warned.add(kind)
                log.warning("could not report progress to the TrainJob's status (%s: %s); training goes on",
                            kind, str(e).splitlines()[0][:160] if str(e) else "")  # fmt: skip
