"""The connection to the API server: kubeconfig, timeouts, retries, and errors as one line each.

Every request has a timeout (``--request-timeout``, 30 s, like kubectl's). Reads are retried by
urllib3's ``Retry`` (see :func:`read_retries`). :func:`call` turns an API or connection error into
a :class:`CliError` naming the verb, kind, namespace/name, HTTP status and reason, plus the action
that fixes it. An answer that is not the API's JSON (an HTML login page, a proxy's error) is one
line. Server URLs are shown without credentials. A redirect is never followed, by a request or by an exec's
websocket (:func:`refuse_ws_redirects`): the kubeconfig's token goes to its server only, and the redirect is one
line (``trainer/redirects.py`` lists every client of the project and how each keeps its credential home).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from operator_cli.constants import REQUEST_TIMEOUT
from operator_cli.errors import CliError
from trainer.redirects import redirect_line

__all__ = [
    "NOT_THE_API_SERVER",
    "REDIRECT_FIX",
    "call",
    "connect",
    "default_namespace",
    "read_retries",
    "redact",
    "refuse_ws_redirects",
    "ws_redirect",
]

T = TypeVar("T")
REDIRECT_FIX = "point the kubeconfig's server: at the API server itself (not a proxy or a login page)"
NOT_THE_API_SERVER = "check that the kubeconfig's server: is the API server (not a proxy, a dashboard or a login page)"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_NOT_OBJECTS = ("get logs", "follow logs", "exec")  # verbs answered with text or a stream, not an object
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]*@")


def redact(text: str) -> str:
    """Remove ``user:password@`` from every URL in ``text``."""
    return _URL_USERINFO.sub(r"\1", text)


def _kubeconfig_path(kubeconfig: str | None) -> str | None:
    """--kubeconfig, else $KUBECONFIG (several files joined by ':' as kubectl merges them), else ~/.kube/config."""
    if kubeconfig:
        return kubeconfig
    files = [f for f in os.environ.get("KUBECONFIG", "").split(os.pathsep) if f and Path(f).is_file()]
    if files:
        return os.pathsep.join(files)
    default = Path.home() / ".kube" / "config"
    return str(default) if default.is_file() else None


def default_namespace(kubeconfig: str | None = None, context: str | None = None) -> str:
    """The namespace kubectl would use: the context's, else the pod's service account's, else default."""
    path = _kubeconfig_path(kubeconfig)
    if path and (kubeconfig is None or Path(kubeconfig).is_file()):
        try:
            from kubernetes import config

            contexts, current = config.list_kube_config_contexts(config_file=path)
            chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
            ns = ((chosen or {}).get("context") or {}).get("namespace")
            if ns:
                return str(ns)
        except Exception:  # a broken kubeconfig is reported by connect(), with the file named
            pass
    elif SERVICE_ACCOUNT_NAMESPACE.is_file():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    return "default"


def _timed_client(configuration, timeout: float):
    from kubernetes import client

    class TimedApiClient(client.ApiClient):
        def call_api(self, *args, **kwargs):
            if kwargs.get("_request_timeout") is None:
                kwargs["_request_timeout"] = (min(timeout, 10.0), timeout)
            return super().call_api(*args, **kwargs)

    api = TimedApiClient(configuration)
    api.request_timeout = timeout
    return api


def read_retries():
    """urllib3's own retries: reads (GET) 3 times on 429 and 5xx, waiting 0, 1, 2 s (or Retry-After).

    A write (POST, PATCH, DELETE) is never sent twice. A refused connection is retried for every
    verb, since the request never left. A server that stalls, or drops the connection after the
    request was sent, is not asked again: urllib3 counts both as a read, and reads get no retry."""
    from urllib3.util.retry import Retry

    return Retry(
        total=3,
        connect=3,
        read=0,
        status=3,
        other=0,
        redirect=0,  # a redirect is never followed: the kubeconfig's credentials go to its server: only
        raise_on_redirect=False,  # the 3xx itself comes back, and call() names it
        allowed_methods=frozenset({"GET"}),
        status_forcelist=(429, 500, 502, 503, 504),
        backoff_factor=0.5,
        raise_on_status=False,  # the last answer goes to the client, which raises ApiException with its body
    )


_WS_REDIRECT = re.compile(r"redirect refused: HTTP (\d+) to (\S+)")


def refuse_ws_redirects() -> None:
    """Make the kubernetes client's websockets (exec, for fetch and upload) follow no redirect.

    websocket-client follows up to 3 redirects and sends every header again, the bearer token included, to
    whatever host the ``Location`` names; the kubernetes client builds its websocket with no way to say
    otherwise, so its ``WebSocket`` class is replaced by one that follows none. A refused redirect reaches
    :func:`call` as the client's ``ApiException(status=0)``, whose reason :func:`ws_redirect` reads back."""
    from kubernetes.stream import ws_client
    from websocket import WebSocket, WebSocketException

    if getattr(ws_client.WebSocket, "refuses_redirects", False):
        return

    class NoRedirectWebSocket(WebSocket):
        refuses_redirects = True

        def connect(self, url, **options):
            options["redirect_limit"] = 0
            try:
                super().connect(url, **options)
            except WebSocketException:
                answer = getattr(self, "handshake_response", None)
                if answer is None or not 300 <= answer.status < 400:
                    raise
                location = (answer.headers or {}).get("location", "")
                raise WebSocketException(f"redirect refused: HTTP {answer.status} to {location}") from None

    ws_client.WebSocket = NoRedirectWebSocket


def ws_redirect(message: str) -> tuple[int, str] | None:
    """(status, location) of a websocket redirect :func:`refuse_ws_redirects` refused, read from an error line."""
    found = _WS_REDIRECT.search(message)
    return (int(found[1]), found[2]) if found else None


def connect(kubeconfig: str | None = None, context: str | None = None, timeout: float = REQUEST_TIMEOUT):
    """An ``ApiClient`` from --kubeconfig, $KUBECONFIG, ~/.kube/config, or the pod's service account."""
    import yaml
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    path = _kubeconfig_path(kubeconfig) or str(Path.home() / ".kube" / "config")
    configuration = client.Configuration()
    try:
        if os.pathsep in path or Path(path).is_file():
            config.load_kube_config(config_file=path, context=context, client_configuration=configuration)
        elif kubeconfig:
            raise CliError(f"kubeconfig not found: {kubeconfig}", hint="pass an existing file to --kubeconfig")
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:
            raise CliError(
                "no kubeconfig found (looked at $KUBECONFIG and ~/.kube/config) and not running in a pod",
                hint="pass --kubeconfig FILE, or use `colbert-k8s render` / `colbert-k8s local` without a cluster",
            )
    except (ConfigException, ValueError, TypeError, OSError, yaml.YAMLError, AttributeError, KeyError) as e:
        first = redact(str(e).splitlines()[0] if str(e) else type(e).__name__)[:200]
        raise CliError(f"cannot use kubeconfig {path}: {first}", hint="check --context and the file") from None
    scheme, _, rest = configuration.host.partition("://")
    if scheme not in ("http", "https") or not rest:
        raise CliError(
            f"the kubeconfig's server {redact(configuration.host)!r} is not an http(s):// URL",
            hint="fix the server: field of the context's cluster in the kubeconfig, e.g. https://HOST:6443",
        )
    configuration.retries = read_retries()
    return _timed_client(configuration, timeout)


def call(
    fn: Callable[[], T], verb: str, kind: str, namespace: str | None, name: str | None, host: str, timeout: float
) -> T:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError, MaxRetryError, ReadTimeoutError

    host = redact(host)
    if name:
        target = f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"  # None: a cluster-scoped object
    else:
        target = f"{kind} in namespace {namespace}" if namespace else kind
    try:
        result = fn()
    except ApiException as e:
        reason = _reason(e)
        status = e.status
        if status in (401, 403):
            hint = (
                "your credentials expired; log in to the cluster again"
                if status == 401
                else f"ask for RBAC permission; check with `kubectl auth can-i {verb} {kind.lower()}s -n {namespace}`"
            )
            raise CliError(f"cannot {verb} {target}: {status} {reason}", hint=hint, status=status) from e
        location = e.headers.get("Location") if e.headers else None
        if status == 0 and (refused := ws_redirect(str(e.reason or ""))):
            status, location = refused  # an exec's websocket (refuse_ws_redirects)
        if status and 300 <= status < 400:
            line = redirect_line(f"the API server at {host} ({verb} {target})", status, location, REDIRECT_FIX)
            raise CliError(line, status=status) from None
        if status == 404:
            raise CliError(f"{target} not found ({verb}: 404 {reason})", exit_code=1, status=404) from e
        if status == 429 or (status and status >= 500):
            raise CliError(f"{verb} {target} failed: {status} {reason}", status=status) from e
        if status == 409:
            raise CliError(
                f"{target} already exists (409)",
                hint="pick another --name, or remove the old job with `colbert-k8s delete NAME`",
                status=409,
            ) from e
        if status == 422:
            raise CliError(f"the API server rejected {target} as invalid (422): {reason}", status=422) from e
        raise CliError(f"{verb} {target} failed: {status} {reason}", status=status) from e
    except HTTPError as e:
        inner = e.reason if isinstance(e, MaxRetryError) and isinstance(e.reason, Exception) else e
        if isinstance(inner, ReadTimeoutError):
            raise CliError(
                f"{host} accepted the connection but did not answer {verb} {target} within {timeout:g}s",
                hint="the API server may be overloaded; retry, or raise --request-timeout",
            ) from inner
        raise CliError(
            f"cannot reach the cluster at {host} ({type(inner).__name__})",
            hint="check --context, your VPN, and `kubectl cluster-info`",
        ) from inner
    except (ValueError, TypeError, AttributeError, KeyError) as e:  # a body that is not the API's JSON (the
        # typed client raises these deserializing one)
        raise CliError(
            f"the server at {host} did not answer {verb} {target} like a Kubernetes API server",
            hint=NOT_THE_API_SERVER,
        ) from e
    if not verb.startswith(_NOT_OBJECTS) and (problem := _not_an_api_object(result, verb)):
        raise CliError(
            f"the server at {host} did not answer {verb} {target} like a Kubernetes API server ({problem})",
            hint=NOT_THE_API_SERVER,
        )
    return result


def _not_an_api_object(result: Any, verb: str) -> str | None:
    """What keeps an answer from being an object as the API server writes one (a mapping whose metadata,
    if any, is a mapping), or None. Only a delete may answer with nothing."""
    if hasattr(result, "to_dict") or (result is None and verb == "delete"):
        return None  # a typed model of the kubernetes client, or an empty answer where one is allowed
    if isinstance(result, (str, bytes)):
        return "got text"
    if not isinstance(result, dict):
        return f"got {'null' if result is None else type(result).__name__}"
    if not isinstance(result.get("metadata", {}), dict):
        return f"its metadata is {type(result['metadata']).__name__}"
    return None


def _reason(e) -> str:
    try:
        body = json.loads(e.body or "{}")
        message = body.get("message") or e.reason
    except ValueError:
        message = e.reason
    return redact(str(message).splitlines()[0][:300]) if message else "no reason given"
