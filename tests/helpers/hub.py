"""A stand-in for the Hugging Face Hub's upload endpoints on 127.0.0.1, for huggingface_hub's own client
(``HF_ENDPOINT``), as harsh as the Hub where the export depends on it:

* tokens: ``Authorization: Bearer`` checked on every call; unknown -> 401, a read token's writes -> 403,
  and so are writes outside the namespaces the user may write (its own, its orgs'); whoami-v2 says the role;
* branches made and deleted (``main`` cannot be), the tree of a revision listed, a file read (``resolve``);
* ``repos/create`` (409 when it exists), ``branch``, repository info (404 for a missing one or revision);
* ``validate-yaml``: the card's front matter must parse, and ``model-index`` must be a list of results;
* ``preupload``: LFS for weights and large or binary files, "regular" otherwise, with each file's id at
  the revision (git SHA-1 for regular files, sha256 for LFS), which the client uses to skip unchanged ones;
* the LFS batch API: an upload action only for objects it does not hold; ``PUT`` of the object checks
  its sha256 and size;
* ``commit``: NDJSON, all or nothing, files added and deleted: an LFS file whose object was not uploaded
  -> 422 and no change;
  a regular file over 10 MB -> 422 (the Hub refuses them outside LFS).

What it does not do: Xet storage (the client uses it when ``hf_xet`` is installed; the tests set
``HF_HUB_DISABLE_XET=1`` so the LFS protocol is used), multipart LFS uploads, pull requests, rate limits,
gated or private visibility checks on reads, ``.gitattributes``, and redirects of file downloads to a CDN.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import re
import threading
from dataclasses import dataclass, field

import yaml

from tests.helpers import free_port

WRITE_TOKEN, READ_TOKEN = "hf_write_token_for_tests", "hf_read_token_for_tests"
_NAMESPACES = ("alice", "my-org")  # where the token's user (alice, of my-org) may write
_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".npy", ".ckpt", ".h5", ".onnx", ".msgpack")
_REGULAR_LIMIT = 10 * 1024 * 1024


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


@dataclass
class Repo:
    private: bool
    branches: dict[str, dict[str, bytes]] = field(default_factory=lambda: {"main": {}})
    commits: list[str] = field(default_factory=list)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    # ---- plumbing ----
    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _send(self, status: int, payload=None, headers: dict | None = None) -> None:
        body = json.dumps(payload if payload is not None else {}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        self._send(status, {"error": message}, {"X-Error-Message": " ".join(message.split())})

    def _role(self) -> str | None:
        token = self.headers.get("Authorization", "").removeprefix("Bearer ")
        return {WRITE_TOKEN: "write", READ_TOKEN: "read"}.get(token)

    def _writer(self, repo_id: str | None = None) -> bool:
        """A write token, and a repository in a namespace the token's user may write (its own, its orgs')."""
        role = self._role()
        if role is None:
            self._error(401, "Invalid credentials in Authorization header")
        elif role != "write" or (repo_id and repo_id.split("/")[0] not in _NAMESPACES):
            self._error(403, "You don't have the rights to write to this repository")
            return False
        return role == "write"

    def _files(self, hub, repo_id: str, revision: str) -> tuple[Repo, dict[str, bytes]] | None:
        """The repository and its branch's files, or None with the Hub's 404 sent (naming what is missing)."""
        repo = hub.repos.get(repo_id)
        if repo is None or revision not in repo.branches:
            self._error(404, "Repository not found" if repo is None else "Revision not found")
            return None
        return repo, repo.branches[revision]

    def _route(self, method: str) -> None:
        hub: HubStandIn = self.server.hub
        hub.requests.append(f"{method} {self.path}")
        path = self.path.split("?")[0]
        for pattern, handler in self.ROUTES:
            m = re.fullmatch(pattern, path)
            if m and handler.__name__.startswith(method.lower() + "_"):
                handler(self, hub, *m.groups())
                return
        self._error(404, f"no route {method} {path}")

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    def do_DELETE(self) -> None:
        self._route("DELETE")

    def do_HEAD(self) -> None:
        self._route("HEAD")

    # ---- endpoints ----
    def get_whoami(self, hub) -> None:
        role = self._role()
        if role is None:
            self._error(401, "Invalid credentials in Authorization header")
            return
        token = {"type": "access_token", "accessToken": {"displayName": "t", "role": role}}
        self._send(200, {"type": "user", "name": "alice", "orgs": [{"name": "my-org"}], "auth": token})

    def post_create(self, hub) -> None:
        body = json.loads(self._body() or b"{}")
        if not self._writer():
            return
        repo_id = f"{body.get('organization') or 'alice'}/{body['name']}"
        if body.get("organization") not in (None, "alice", "my-org"):
            self._error(403, f"You don't have the rights to create a model under the namespace {body['organization']}")
        elif repo_id in hub.repos:  # the Hub's 409 names the repository's URL, which the client reads
            message = "You already created this model repo"
            self._send(409, {"error": message, "url": f"{hub.url}/{repo_id}"}, {"X-Error-Message": message})
        else:
            hub.repos[repo_id] = Repo(private=body.get("visibility") == "private" or bool(body.get("private")))
            self._send(200, {"url": f"{hub.url}/{repo_id}", "name": repo_id})

    def post_branch(self, hub, repo_id, branch) -> None:
        self._body()
        if not self._writer(repo_id):
            return
        repo = hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "Repository not found")
        elif branch in repo.branches:
            self._error(409, "Reference already exists")
        else:
            repo.branches[branch] = dict(repo.branches["main"])
            self._send(200, {})

    def delete_branch(self, hub, repo_id, branch) -> None:
        if not self._writer(repo_id):
            return
        repo = hub.repos.get(repo_id)
        if repo is None or branch not in repo.branches:
            self._error(404, "Revision not found")
        elif branch == "main":
            self._error(403, "Cannot delete the main branch")
        else:
            del repo.branches[branch]
            self._send(200, {})

    def get_tree(self, hub, repo_id, revision) -> None:
        if (found := self._files(hub, repo_id, revision)) is None:
            return
        files = sorted(found[1].items())
        self._send(200, [{"type": "file", "path": p, "size": len(b), "oid": git_sha1(b)} for p, b in files])

    def get_info(self, hub, repo_id, revision=None) -> None:
        if (found := self._files(hub, repo_id, revision or "main")) is None:
            return
        repo, files = found
        sha = repo.commits[-1] if repo.commits else "0" * 40
        siblings = [{"rfilename": p} for p in sorted(files)]
        self._send(200, {"id": repo_id, "sha": sha, "private": repo.private, "siblings": siblings})

    def get_info_revision(self, hub, repo_id, revision) -> None:
        self.get_info(hub, repo_id, revision)

    def get_resolve(self, hub, repo_id, revision, path, head: bool = False) -> None:
        """A file's bytes (``hf_hub_download``: a HEAD for its commit, ETag and size, then a GET)."""
        repo = hub.repos.get(repo_id)
        data = None if repo is None else repo.branches.get(revision, {}).get(path)
        if data is None:
            self._error(404, "Entry not found")
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", f'"{git_sha1(data)}"')
        self.send_header("X-Repo-Commit", repo.commits[-1] if repo.commits else "0" * 40)
        self.end_headers()
        if not head:
            self.wfile.write(data)

    def head_resolve(self, hub, repo_id, revision, path) -> None:
        self.get_resolve(hub, repo_id, revision, path, head=True)

    def post_validate(self, hub) -> None:
        body = json.loads(self._body())
        text = body.get("content", "")
        m = re.match(r"---\n(.*?)\n---\n", text, re.S)
        try:
            meta = yaml.safe_load(m.group(1)) if m else {}
        except yaml.YAMLError as e:
            self._error(400, f"Invalid YAML in README.md: {e}")
            return
        index = (meta or {}).get("model-index")
        if index is not None and not (isinstance(index, list) and all("results" in r for r in index)):
            self._error(400, "Invalid model-index: each entry needs results")
            return
        hub.validated.append(text)
        self._send(200, {"errors": [], "warnings": []})

    def post_preupload(self, hub, repo_id, revision) -> None:
        body = json.loads(self._body())
        if not self._writer(repo_id) or (found := self._files(hub, repo_id, revision)) is None:
            return
        repo, files = found
        out = []
        for f in body["files"]:
            sample = base64.b64decode(f["sample"])
            lfs = f["size"] > _REGULAR_LIMIT or f["path"].endswith(_LFS_SUFFIXES) or b"\0" in sample
            have = files.get(f["path"])
            oid = None if have is None else (hashlib.sha256(have).hexdigest() if lfs else git_sha1(have))
            out.append(
                {"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid}
            )
        self._send(200, {"files": out, "commitOid": repo.commits[-1] if repo.commits else None})

    def post_lfs_batch(self, hub, repo_id) -> None:
        body = json.loads(self._body())
        if not self._writer(repo_id):
            return
        objects = []
        for o in body["objects"]:
            entry = {"oid": o["oid"], "size": o["size"]}
            if o["oid"] not in hub.lfs:
                entry["actions"] = {"upload": {"href": f"{hub.url}/lfs-upload/{o['oid']}/{o['size']}"}}
            objects.append(entry)
        self._send(200, {"transfer": "basic", "objects": objects})

    def put_lfs_object(self, hub, oid, size) -> None:
        data = self._body()
        if hub.cut_uploads > 0:  # a connection that breaks during the upload
            hub.cut_uploads -= 1
            self.close_connection = True
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if hashlib.sha256(data).hexdigest() != oid or len(data) != int(size):
            self._error(400, "the object does not match its oid and size")
            return
        hub.lfs[oid] = data
        hub.uploads.append(oid)
        self._send(200, {})

    def post_commit(self, hub, repo_id, revision) -> None:
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        if not self._writer(repo_id) or (found := self._files(hub, repo_id, revision)) is None:
            return
        repo, files = found
        if hub.fail_commits > 0:
            hub.fail_commits -= 1
            self._error(500, "Internal Error - We're working hard to fix this as soon as possible!")
            return
        staged = dict(files)
        for line in lines:
            value = line["value"]
            if line["key"] == "file":
                data = base64.b64decode(value["content"])
                if len(data) > _REGULAR_LIMIT:
                    self._error(422, f"{value['path']} is larger than 10 MB; upload it with LFS")
                    return
                staged[value["path"]] = data
            elif line["key"] == "lfsFile":
                if value["oid"] not in hub.lfs:
                    self._error(422, f"LFS object {value['oid']} of {value['path']} was not uploaded")
                    return
                staged[value["path"]] = hub.lfs[value["oid"]]
            elif line["key"] == "deletedFile":
                if value["path"] not in staged:
                    self._error(404, f"{value['path']} does not exist in the repository")
                    return
                del staged[value["path"]]
        repo.branches[revision] = staged  # all or nothing
        oid = hashlib.sha1(json.dumps(sorted(staged)).encode() + bytes(len(repo.commits)), usedforsecurity=False)
        repo.commits.append(oid.hexdigest())
        self._send(
            200,
            {
                "commitOid": oid.hexdigest(),
                "commitUrl": f"{hub.url}/{repo_id}/commit/{oid.hexdigest()}",
                "success": True,
            },
        )

    _REPO = r"([\w.-]+/[\w.-]+)"
    ROUTES = [
        (r"/api/whoami-v2", get_whoami),
        (r"/api/repos/create", post_create),
        (rf"/api/models/{_REPO}/branch/([\w.-]+)", post_branch),
        (rf"/api/models/{_REPO}/branch/([\w.-]+)", delete_branch),
        (rf"/api/models/{_REPO}/tree/([\w.%-]+)", get_tree),
        (rf"/api/models/{_REPO}/revision/([\w.%-]+)", get_info_revision),
        (rf"/api/models/{_REPO}", get_info),
        (r"/api/validate-yaml", post_validate),
        (rf"/api/models/{_REPO}/preupload/([\w.%-]+)", post_preupload),
        (rf"/{_REPO}\.git/info/lfs/objects/batch", post_lfs_batch),
        (r"/lfs-upload/([0-9a-f]{64})/(\d+)", put_lfs_object),
        (rf"/api/models/{_REPO}/commit/([\w.%-]+)", post_commit),
        (rf"/{_REPO}/resolve/([\w.%-]+)/(.+)", get_resolve),
        (rf"/{_REPO}/resolve/([\w.%-]+)/(.+)", head_resolve),
    ]


class HubStandIn:
    """The server on a free port, with its repositories and what it was asked, for assertions."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}
        self.requests: list[str] = []
        self.uploads: list[str] = []
        self.validated: list[str] = []
        self.fail_commits = 0
        self.cut_uploads = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), _Handler)
        self.server.hub = self
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def env(self, token: str = WRITE_TOKEN) -> dict[str, str]:
        return {"HF_ENDPOINT": self.url, "HF_TOKEN": token, "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0"}

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        return self.repos[repo_id].branches[revision]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
