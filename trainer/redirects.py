"""No credential follows a redirect: each HTTP client of the project sends its token, key or password only to the
host the user named.

A redirect to another host (an OAuth proxy's login page, a misconfigured ingress, a hostile server) must never
receive a credential. The clients, what each sends, and what keeps it home:

* **Model Registry** (``trainer/serve/registry.py``) and **TrainJob progress** (``trainer/reporting/progress.py``),
  a bearer token over urllib. urllib's default opener follows a redirect and copies every header to the new host,
  https to http included, so both open through :func:`opener`, which follows none: a 3xx is the answer, and the
  caller says so in one :func:`redirect_line`.
* **Kubernetes API** (``operator_cli/kube/transport.py``), the kubeconfig's token over urllib3: ``Retry(redirect=0,
  raise_on_redirect=False)`` hands the 3xx back unfollowed, named in one line. urllib3 would also strip
  ``Authorization`` on a cross-host redirect (``Retry.remove_headers_on_redirect``).
* **Pod exec** (fetch, upload) over websocket-client, the same token: websocket-client follows up to 3 redirects with
  every header, so ``operator_cli/kube/transport.py`` makes it follow none.
* **Hugging Face Hub** (export, model and data downloads; huggingface_hub over httpx), ``HF_TOKEN``: httpx strips
  ``Authorization`` on a redirect to another origin, but huggingface_hub's file resolver follows redirects itself
  to the same host name on any port, with the header. :func:`guard_hub` drops ``Authorization`` from every request
  that is not for the endpoint's own origin (or, for the public Hub, its own hosts). A download's redirect to the
  Hub's CDN is still followed, without the token, as it must be.
* **Object stores** (obstore over reqwest): AWS signatures, Azure and GCS keys travel in ``Authorization``, which
  reqwest removes when a redirect changes host or port; an SAS token travels in the query, which a ``Location``
  replaces. S3's session token (``x-amz-security-token``) is not removed, so :func:`probe_endpoint` refuses a
  custom endpoint (``AWS_ENDPOINT_URL``, Azure's) that answers with a redirect to another host, before any
  credential is sent.
* **MLflow, Weights & Biases** (``tracking.report_to``): their own clients over requests, which strips
  ``Authorization`` when a redirect changes host (``requests.Session.should_strip_auth``).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request

__all__ = [
    "NoRedirect",
    "Redirected",
    "guard_hub",
    "hub_redirect",
    "opener",
    "origin",
    "probe_endpoint",
    "redact",
    "redirect_line",
    "shown",
]

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
_PUBLIC_HUB = frozenset({"huggingface.co", "hf.co"})


class Redirected(ValueError):
    """An endpoint answered with a redirect that was not followed: its message is the one line to show."""


def redact(url: str) -> str:
    """``url`` without its user information, for logs and errors.

    >>> redact("https://user:secret@status.example:8443/v1/x?a=1")
    'https://status.example:8443/v1/x?a=1'
    """
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def shown(url: str | None, limit: int = 160) -> str:
    """``url`` as an error line shows it: no user information, no query (a login page's state), cut to ``limit``.

    >>> shown("https://u:p@login.example/authorize?state=abc&client=x")
    'https://login.example/authorize'
    """
    if not url:
        return "nowhere (no Location)"
    parts = urllib.parse.urlsplit(redact(url))
    text = urllib.parse.urlunsplit(parts._replace(query="", fragment=""))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) with the scheme's default port filled in: two URLs of one origin share a credential.

    >>> origin("https://Hub.example/api") == origin("https://hub.example:443/x"), origin("http://h:8080")
    (True, ('http', 'h', 8080))
    """
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port or _DEFAULT_PORTS.get(scheme)


def redirect_line(what: str, status: int | None, location: str | None, fix: str, followed: bool = False) -> str:
    """The one line for a redirect: who answered, where it pointed, what became of it and the fix. ``followed``:
    the client went there without the credential (the Hub's downloads must), rather than not at all.

    >>> redirect_line("http://reg:8080/api/x", 302, "https://login.example/?s=1", "set MODEL_REGISTRY_URL to ...")
    'http://reg:8080/api/x answered HTTP 302, a redirect to https://login.example/: not followed (credentials go \
only to the host you named); set MODEL_REGISTRY_URL to ...'
    """
    answered = f"answered HTTP {status}, a redirect" if status else "answered with a redirect"
    done = "followed without the token" if followed else "not followed"
    return f"{what} {answered} to {shown(location)}: {done} (credentials go only to the host you named); {fix}"


class NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx is an answer, not a new destination: urllib raises it as an ``HTTPError`` (its ``Location`` in
    ``headers``) instead of sending the request, headers and all, to the new host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def opener(context=None) -> urllib.request.OpenerDirector:
    """urllib's opener that follows no redirect; ``context``: the ``ssl.SSLContext`` for https (a CA to verify)."""
    handlers: list = [NoRedirect]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    return urllib.request.build_opener(*handlers)


_probed: set[str] = set()


def probe_endpoint(url: str, setting: str, timeout: float = 10) -> None:
    """Refuse ``url`` (a store's custom endpoint, from ``setting``) when it answers a request without credentials
    with a redirect to another host: the store's client would follow it with a session token. Any other answer,
    or none, is the store client's to report. Asked once per URL and process (until it redirects).

    Raises:
        Redirected: the one line naming the redirect and the fix.
    """
    if url in _probed:
        return
    try:
        with opener().open(urllib.request.Request(redact(url), method="GET"), timeout=timeout):
            pass
    except urllib.error.HTTPError as e:
        location = e.headers.get("Location") if 300 <= e.code < 400 else None
        if location and origin(urllib.parse.urljoin(url, location)) != origin(url):
            raise Redirected(
                redirect_line(
                    f"{setting} {shown(url)}",
                    e.code,
                    urllib.parse.urljoin(url, location),
                    f"set {setting} to the store's own address (not a proxy or a login page)",
                )
            ) from None
    except (OSError, ValueError):
        pass  # unreachable or odd: the store's own calls say so, with their retries
    _probed.add(url)


_hub_guarded = False


def _hub_origins() -> set[tuple[str, str, int | None]]:
    """Where ``HF_TOKEN`` may go: the endpoint in use (``HF_ENDPOINT``), and the public Hub's own hosts when that
    is the endpoint."""
    from huggingface_hub import constants

    endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    allowed = {origin(endpoint)}
    if origin(endpoint)[1] in _PUBLIC_HUB:
        allowed |= {("https", host, 443) for host in _PUBLIC_HUB}
    return allowed


def _strip_foreign_auth(request) -> None:
    """httpx request hook: a request for another origin than the Hub's loses its ``Authorization``."""
    url = str(request.url)
    if "authorization" in request.headers and origin(url) not in _hub_origins():
        del request.headers["authorization"]


def _hub_client():
    # huggingface_hub's own factory (its hook enforces HF_HUB_OFFLINE and adds request ids), plus ours
    from huggingface_hub.utils._http import default_client_factory

    client = default_client_factory()
    client.event_hooks["request"].append(_strip_foreign_auth)
    return client


def guard_hub() -> None:
    """Make huggingface_hub's shared client send ``HF_TOKEN`` only to the Hub's origin (the module docstring says
    why); for every Hub call of this process, once."""
    global _hub_guarded
    if not _hub_guarded:
        import huggingface_hub

        huggingface_hub.set_client_factory(_hub_client)
        _hub_guarded = True


def hub_redirect(error: BaseException, fix: str) -> str | None:
    """The one line when a Hub call's failing answer came from another origin than the Hub's: a redirect, followed
    without the token (:func:`guard_hub`); else None."""
    response = getattr(error, "response", None)
    request = getattr(response, "request", None)
    if request is None or origin(str(request.url)) in _hub_origins():
        return None
    from huggingface_hub import constants

    hops = [r.status_code for r in getattr(response, "history", []) if 300 <= r.status_code < 400]
    endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    return redirect_line(f"the Hub at {shown(endpoint)}", hops[0] if hops else None, str(request.url), fix, True)
