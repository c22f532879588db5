"""Real-protocol stand-ins for remote storage, on 127.0.0.1.

* :class:`MotoS3`: moto's S3 server (a real S3 HTTP API; SigV4 requests, ETags, 404s) from
  ``.venv-moto`` (installed by ``scripts/setup.sh``, apart from the main venv: its botocore pins
  python-dateutil<3). What it does not do: eventual consistency, throttling, multipart ETags unless
  the client uploads in parts, IAM (any credentials are accepted).
* :class:`FileServer`: an HTTP server for a directory with byte ranges (``Range: bytes=a-b`` -> 206),
  counting requests, and able to drop the first N responses half-way (a connection cut mid-file).
  What it does not do: TLS, redirects, chunked encoding.
"""

from __future__ import annotations

import http.server
import os
import re
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from tests.helpers import ROOT, free_port

MOTO_SERVER = ROOT / ".venv-moto" / "bin" / "moto_server"


class MotoS3:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(self.url, timeout=1)
                break
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.2)

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": "testing-key",
            "AWS_SECRET_ACCESS_KEY": "testing-secret",
            "AWS_ENDPOINT_URL": self.url,
            "AWS_REGION": "us-east-1",
        }

    def bucket(self, name: str) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.url}/{name}", method="PUT"), timeout=10)

    def store(self, bucket: str):
        """An obstore client of ``bucket`` on this server (path-style, plain HTTP)."""
        from obstore.store import S3Store

        return S3Store(
            bucket,
            endpoint=self.url,
            region="us-east-1",
            access_key_id="testing-key",
            secret_access_key="testing-secret",
            virtual_hosted_style_request=False,
            client_options={"allow_http": True},
        )

    def put(self, bucket: str, key: str, data: bytes) -> None:
        import obstore

        obstore.put(self.store(bucket), key, data)

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under ``prefix``, by its key after the prefix."""
        import obstore

        store = self.store(bucket)
        found = [o["path"] for batch in obstore.list(store, prefix=prefix) for o in batch]
        return {p[len(prefix) :]: bytes(obstore.get(store, p).bytes()) for p in found}

    def put_dir(self, bucket: str, prefix: str, directory: Path) -> None:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                self.put(bucket, f"{prefix}/{path.relative_to(directory)}", path.read_bytes())

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


class _RangeHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def _file(self) -> Path | None:
        path = (self.server.root / self.path.lstrip("/").split("?")[0]).resolve()
        return path if path.is_file() and self.server.root in path.parents else None

    def do_HEAD(self) -> None:
        self.server.requests.append(f"HEAD {self.path}")
        path = self._file()
        if path is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(path.stat().st_size))
        self.send_header("Last-Modified", self.date_time_string(int(path.stat().st_mtime)))
        self.end_headers()

    def do_GET(self) -> None:
        self.server.requests.append(f"GET {self.path} {self.headers.get('Range', '')}")
        path = self._file()
        if path is None:
            self.send_error(404)
            return
        data = path.read_bytes()
        start, end = 0, len(data) - 1
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if m:
            start, end = int(m.group(1)), int(m.group(2)) if m.group(2) else len(data) - 1
            end = min(end, len(data) - 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start : end + 1]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.server.drops > 0:  # cut the connection half-way through the body
            self.server.drops -= 1
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(body)


class FileServer:
    def __init__(self, root: Path, drops: int = 0) -> None:
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RangeHandler)
        self.httpd.daemon_threads = True
        self.httpd.root, self.httpd.requests, self.httpd.drops = root.resolve(), [], drops
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def requests(self) -> list[str]:
        return self.httpd.requests

    def drop(self, n: int) -> None:
        self.httpd.drops = n

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def moto_available() -> str | None:
    if not MOTO_SERVER.exists():
        return f"{MOTO_SERVER} is missing: run scripts/setup.sh train,test"
    return None if os.access(MOTO_SERVER, os.X_OK) else f"{MOTO_SERVER} is not executable"


class StallingProxy:
    """An HTTP proxy in front of ``upstream`` (moto) that holds any request whose path contains ``stall``
    unanswered while ``stall`` is set, as a link that dies mid-upload does; ``stalled`` is set when one is
    held. Headers (Host included, which SigV4 signs) and bodies are passed on as they are."""

    def __init__(self, upstream: str, stall: str | None = None) -> None:
        import http.client
        import urllib.parse

        proxy = self
        self.stall, self.stalled, self.release = stall, threading.Event(), threading.Event()
        target = urllib.parse.urlsplit(upstream)

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if proxy.stall and proxy.stall in self.path:
                    proxy.stalled.set()
                    proxy.release.wait(600)
                    self.close_connection = True
                    return
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                conn.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
                answer = conn.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                head = self.command == "HEAD"  # its Content-Length is the object's: kept, and no body
                for k, v in answer.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection") and (head or k.lower() != "content-length"):
                        self.send_header(k, v)
                if not head:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not head:
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
