"""Two plain-http servers on 127.0.0.1 for redirect tests: :class:`Elsewhere` records every request that reaches
it (method, path and the credential headers), and :class:`Redirector` answers every request with one redirect
status and a ``Location`` on :class:`Elsewhere` (another port: another origin for every client), over https when
given a certificate (an https endpoint redirecting to plain http).

What a real redirect does that these do not: a login page's body and cookies, a chain of several redirects, a
``Location`` on another host name (here only the port differs: huggingface_hub's resolver, for one, told the two
apart by host name alone), and a relative ``Location`` (same origin, which clients may follow).
"""

from __future__ import annotations

import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["CREDENTIAL_HEADERS", "Elsewhere", "Redirector"]

# What a client may carry a credential in: a bearer or signature, S3's session token, a cookie.
CREDENTIAL_HEADERS = ("authorization", "x-amz-security-token", "cookie", "proxy-authorization")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler], cert=None):
        super().__init__(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        if cert is not None:  # a trustme LeafCert for "localhost": https, as an endpoint that gets a token is
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            cert.configure_cert(context)
            self.socket = context.wrap_socket(self.socket, server_side=True)
            self.url = f"https://localhost:{self.server_address[1]}"
        self.thread = threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _body(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)

    def _answer(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def do_GET(self) -> None:  # noqa: N802
        self._answer()

    do_POST = do_PUT = do_HEAD = do_DELETE = do_PATCH = do_GET


class _RecordHandler(_Handler):
    def _answer(self) -> None:
        self._body()
        seen = {k.lower(): v for k, v in self.headers.items() if k.lower() in CREDENTIAL_HEADERS}
        self.server.requests.append((self.command, self.path, seen))
        data = b'{"code": "401", "message": "a login page"}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


class Elsewhere(_Server):
    """The host a redirect points at: it answers 401 to everything and keeps ``requests``: (method, path, the
    credential headers it received)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        super().__init__(_RecordHandler)

    def credentials(self) -> list[dict[str, str]]:
        """The credential headers of every request that arrived (empty dicts for requests without one)."""
        return [seen for _, _, seen in self.requests]


class _RedirectHandler(_Handler):
    def _answer(self) -> None:
        self._body()
        self.server.seen.append((self.command, self.path, self.headers.get("Authorization")))
        self.send_response(self.server.status)
        self.send_header("Location", self.server.target + self.path)
        self.send_header("Content-Length", "0")
        self.end_headers()


class Redirector(_Server):
    """The endpoint the user named: every request is answered ``status`` with ``Location`` = ``target`` + the
    same path; ``seen``: (method, path, its Authorization header)."""

    def __init__(self, status: int, target: str, cert=None) -> None:
        self.status, self.target = status, target.rstrip("/")
        self.seen: list[tuple[str, str, str | None]] = []
        super().__init__(_RedirectHandler, cert)
